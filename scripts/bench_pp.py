"""Prompt processing: edgespec's rate against llama-bench's, same GGUF, same machine.

A session's prompts are evaluated at whatever rate the backend reaches, so that
rate should be llama.cpp's own. This runs, alternately, ``llama-bench -p N -n 0``
(built from the llama.cpp llama-cpp-python vendors, ``scripts/llamacpp_reference.py``)
and edgespec's prefill of N tokens through the engine's cache (after ``--depth``
tokens already cached, as a session's later prompts are), with the same threads,
batch and flash-attention setting, and prints each rate and the ratio per round.

    python scripts/bench_pp.py --model qwen2.5-coder-1.5b-instruct --rounds 3
    python scripts/bench_pp.py --depth 1024
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("-p", "--n-prompt", type=int, default=512)
    parser.add_argument("--depth", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="default: as each does (physical cores)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
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
