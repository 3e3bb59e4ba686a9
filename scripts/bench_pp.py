"""Prompt processing: edgespec's rate against llama-bench's, and against llama-server's
on captured client requests; same GGUF, same machine.

A session's prompts are evaluated at whatever rate the backend reaches, so that
rate should be llama.cpp's own. This runs, alternately, ``llama-bench -p N -n 0``
(built from the llama.cpp llama-cpp-python vendors, ``scripts/llamacpp_reference.py``)
and edgespec's prefill of N tokens through the engine's cache (after ``--depth``
tokens already cached, as a session's later prompts are), with the same threads,
batch and flash-attention setting, and prints each rate and the ratio per round.

``--servers``: instead, ``edgespec serve`` and llama-server (both with their defaults,
both up for the whole run) are sent each captured request of ``--set`` (client-val: what
aider and the chats sent), whole, with ``cache_prompt: false`` and one token to
generate, the servers' order alternating from round to round; the rate is the prompt's
tokens over the request's wall time (what a client waits for: templating, the prompt's
passes and one step), and each server's own ``timings.prompt_per_second`` beside it.

    python scripts/bench_pp.py --model qwen2.5-coder-1.5b-instruct --rounds 3
    python scripts/bench_pp.py --depth 1024
    python scripts/bench_pp.py --servers --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from llamacpp_reference import build_llama_bench  # noqa: E402


def llama_bench(binary: Path, model: Path, n: int, depth: int, threads: int, reps: int) -> float:
    """llama-bench's pp rate (tok/s, its mean over ``reps``)."""
    out = subprocess.run([str(binary), "-m", str(model), "-p", str(n), "-n", "0", "-d", str(depth),
                          "-t", str(threads), "-r", str(reps), "-o", "json"],
                         check=True, capture_output=True, text=True).stdout
    return float(json.loads(out)[0]["avg_ts"])


def edgespec_pp(backend, n: int, depth: int, reps: int) -> float:
    """edgespec's prefill rate over ``n`` tokens after ``depth`` cached (tok/s, the mean
    over ``reps`` of n / seconds), as the engine prefills: the cache's sync."""
    from edgespec.core.cache import CachedModel
    rng = np.random.default_rng(0)
    tokens = [int(t) for t in rng.integers(100, backend.n_vocab - 1000, depth + n)]
    cache = CachedModel(backend)
    rates = []
    for _ in range(reps):
        cache.rewind(0)
        if depth:
            cache.sync(tokens[:depth], need_logits=False)
        start = time.perf_counter()
        cache.sync(tokens, need_logits=False)
        rates.append(n / (time.perf_counter() - start))
    return float(np.mean(rates))


def server_rates(args) -> int:
    """edgespec serve against llama-server on the captured requests (see the docstring)."""
    import httpx
    from bench_sessions import PROMPTS, start
    from capture_clients import free_port
    from llamacpp_reference import build_llama_server
    from edgespec.models.catalog import resolve_model
    model = resolve_model(args.model, fetch=True)
    args.llama_server = build_llama_server(log=lambda m: print(m, file=sys.stderr))
    options = argparse.Namespace(ctx=8192, threads=len(os.sched_getaffinity(0)), edgespec_args="--cache-disk 0",
                                 logs=None, llama_server=args.llama_server)
    ports = {name: free_port() for name in ("edgespec", "llama")}
    servers = {name: start(name, model, port, options) for name, port in ports.items()}
    requests = json.loads((PROMPTS / f"{args.set}.json").read_text())
    ratios = []
    try:
        for round_ in range(args.rounds):
            order = ["edgespec", "llama"] if round_ % 2 == 0 else ["llama", "edgespec"]
            for i, request in enumerate(requests):
                rates = {}
                for name in order:
                    body = {"messages": request["messages"], "max_tokens": 1, "temperature": 0,
                            "cache_prompt": False}
                    started = time.perf_counter()
                    reply = httpx.post(f"http://127.0.0.1:{ports[name]}/v1/chat/completions", json=body,
                                       timeout=3600).json()
                    wall = time.perf_counter() - started
                    n = reply["usage"]["prompt_tokens"]
                    rates[name] = (n / wall, reply["timings"]["prompt_per_second"], n)
                ratios.append(rates["edgespec"][0] / rates["llama"][0])
                print(f"round {round_ + 1} {request['job']} #{i} ({rates['edgespec'][2]} tokens): "
                      f"edgespec {rates['edgespec'][0]:.1f} tok/s (its timings {rates['edgespec'][1]:.1f}), "
                      f"llama-server {rates['llama'][0]:.1f} (its timings {rates['llama'][1]:.1f}), "
                      f"ratio {ratios[-1]:.3f}", flush=True)
    finally:
        for process in servers.values():
            process.terminate()
            process.wait()
    geo = float(np.exp(np.mean(np.log(ratios))))
    print(f"edgespec / llama-server, prompt tokens per second of wall time: geometric mean {geo:.3f}, "
          f"{min(ratios):.3f}–{max(ratios):.3f}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("-p", "--n-prompt", type=int, default=512)
    parser.add_argument("--depth", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="default: as each does (physical cores)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--servers", action="store_true",
                        help="edgespec serve against llama-server on the captured requests of --set")
    parser.add_argument("--set", default="client-val")
    args = parser.parse_args()
    if args.servers:
        return server_rates(args)
    from edgespec.backends.llamacpp import LlamaCppBackend
    from edgespec.models.catalog import resolve_model
    model = resolve_model(args.model, fetch=True)
    binary = build_llama_bench(log=lambda m: print(m, file=sys.stderr))
    backend = LlamaCppBackend(model, n_ctx=max(4096, args.depth + args.n_prompt + 16),
                              n_threads=args.threads, kernels="fast")
    threads = backend.n_threads
    print(f"{Path(model).name}: pp{args.n_prompt} at depth {args.depth}, {threads} threads "
          f"({os.cpu_count()} CPUs), batch {backend.n_batch}")
    ratios = []
    for round_ in range(args.rounds):
        first, second = ("llama-bench", "edgespec") if round_ % 2 == 0 else ("edgespec", "llama-bench")
        rates = {}
        for who in (first, second):
            rates[who] = llama_bench(binary, model, args.n_prompt, args.depth, threads, args.reps) \
                if who == "llama-bench" else edgespec_pp(backend, args.n_prompt, args.depth, args.reps)
        ratios.append(rates["edgespec"] / rates["llama-bench"])
        print(f"round {round_ + 1}: llama-bench {rates['llama-bench']:.1f} tok/s, edgespec "
              f"{rates['edgespec']:.1f} tok/s, ratio {ratios[-1]:.3f}", flush=True)
    print(f"edgespec / llama-bench: {min(ratios):.3f}–{max(ratios):.3f}")
    backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
