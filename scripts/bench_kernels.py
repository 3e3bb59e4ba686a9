"""What bit-exact kernels cost: the target's n-token pass v(n) in one-token steps,
its prompt processing, auto mode's speed on the edit and chat sets, and the time
of captured client requests (aider asking for a whole file back), with
``--kernels fast`` and ``--kernels exact``, alternating in one run (each mode in a
process of its own: llama.cpp reads one of the switches once per process).

    python scripts/bench_kernels.py [--rounds 2] [--prompts 2] [--max-tokens 128]
                                    [--requests 2] [--request-tokens 400]
    python scripts/bench_kernels.py --backend mlx --model smollm2-135m-instruct \
                                    --draft lookup --requests 0     # MLX: a probe at load

Auto mode's speed is a ratio to plain decoding with the same kernels, each
speculative run between two plain runs of the same prompt; the modes' plain speeds
are printed too (exact kernels may be slower at plain decoding itself). A client
request is timed from a cold cache, as a user waits for it: its prompt processed,
then its reply (``--request-tokens``) decoded in auto mode; the table sums them over
the requests.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SIZES = (1, 2, 4, 8, 16, 32)


def measure(kernels: str, args: argparse.Namespace) -> dict:
    """In this process: the figures of one mode."""
    import edgespec
    from edgespec.measure.prompt_sets import load_prompt_set, request_entries

    start = time.perf_counter()
    engine = edgespec.load(args.model, draft=args.draft, backend=args.backend, draft_backend="llama.cpp",
                           num_draft="auto", n_ctx=4096, kernels=kernels, fetch=True)
    load_s = time.perf_counter() - start  # exact kernels: the probe's steps and passes too
    target = engine.target
    text = "def mean(xs):\n    return sum(xs) / len(xs)\n\n" * 120
    corpus = target.tokenize(text, add_bos=False, special=False)
    start = time.perf_counter()
    target.rewind(0)
    target.forward(corpus[:1000], last_only=True)
    prefill = 1000 / (time.perf_counter() - start)
    seconds = {}
    for n in SIZES:
        times = []
        for _ in range(5):
            target.rewind(300)
            t = time.perf_counter()
            target.forward(corpus[300:300 + n])
            times.append(time.perf_counter() - t)
        seconds[n] = statistics.median(times)
    v = {n: seconds[n] / seconds[1] for n in SIZES}
    speeds = {}
    for name in ("edit", "chat"):
        ratios, plain = [], []
        for prompt in load_prompt_set(name)[:args.prompts]:
            messages = [{"role": "user", "content": prompt}]
            runs = []
            for speculative in (False, True, False):
                g = engine.chat(messages, stream=False, temperature=0, max_tokens=args.max_tokens,
                                speculative=speculative)
                runs.append(g.stats.tokens_per_second)
            ratios.append(runs[1] / ((runs[0] + runs[2]) / 2))
            plain.append((runs[0] + runs[2]) / 2)
        speeds[name] = {"auto_x_plain": statistics.geometric_mean(ratios), "plain_tok_s": statistics.mean(plain)}
    prefill_s, decode_s = [], []
    whole_file = [e["messages"] for e in request_entries("client") if e["client"] == "aider-whole"]
    for messages in whole_file[:args.requests]:
        engine.target_cache.rewind(0)  # cold, as a client's new request finds it
        g = engine.chat(messages, stream=False, temperature=0, max_tokens=args.request_tokens)
        prefill_s.append(g.stats.prefill_time_s)
        decode_s.append(g.stats.decode_time_s)
    engine.close()
    return {"kernels": kernels, "bit_exact": target.bit_exact, "load_s": load_s, "step_ms": 1000 * seconds[1],
            "prefill_tok_s": prefill, "v": v, "sets": speeds,
            "request_prefill_s": sum(prefill_s), "request_decode_s": sum(decode_s)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="fast, exact: this many times each")
    parser.add_argument("--prompts", type=int, default=2, help="of each set")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--requests", type=int, default=2, help="captured aider whole-file requests (client set)")
    parser.add_argument("--request-tokens", type=int, default=400, help="of each request's reply")
    parser.add_argument("--backend", choices=("llama.cpp", "mlx"), default="llama.cpp", help="the target's")
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct", help="on llama.cpp, or lookup")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args)))
        return
    results = {"fast": [], "exact": []}
    for _ in range(args.rounds):
        for kernels in ("fast", "exact"):
            out = subprocess.run([sys.executable, *sys.argv, "--child", kernels], capture_output=True, text=True,
                                 env={**os.environ, "EDGESPEC_KERNELS": kernels})
            if out.returncode:
                sys.exit(out.stderr[-3000:])
            result = json.loads(out.stdout.strip().splitlines()[-1])
            results[kernels].append(result)
            print(json.dumps(result), flush=True)

    def span(kernels, get, fmt="{:.2f}"):
        values = [get(r) for r in results[kernels]]
        return fmt.format(min(values)) + ("" if len(values) < 2 else "-" + fmt.format(max(values)))

    rows = [("bit-exact", lambda r: r["bit_exact"], "{}"), ("loading, s", lambda r: r["load_s"], "{:.1f}"),
            ("one-token step, ms", lambda r: r["step_ms"], "{:.1f}"),
            ("prompt processing, tok/s", lambda r: r["prefill_tok_s"], "{:.0f}")]
    rows += [(f"v({n})", (lambda n: lambda r: r["v"][str(n)])(n), "{:.2f}") for n in SIZES[1:]]
    for name in ("edit", "chat"):
        rows += [(f"{name}: plain tok/s", (lambda s: lambda r: r["sets"][s]["plain_tok_s"])(name), "{:.1f}"),
                 (f"{name}: auto x plain", (lambda s: lambda r: r["sets"][s]["auto_x_plain"])(name), "{:.3f}")]
    if args.requests:
        rows += [("client requests: prefill s", lambda r: r["request_prefill_s"], "{:.1f}"),
                 ("client requests: auto decode s", lambda r: r["request_decode_s"], "{:.1f}"),
                 ("client requests: total s", lambda r: r["request_prefill_s"] + r["request_decode_s"], "{:.1f}")]
    print(f"\n| {'':26s} | fast | exact |\n|---|---|---|")
    for label, get, fmt in rows:
        print(f"| {label:26s} | {span('fast', get, fmt)} | {span('exact', get, fmt)} |")


if __name__ == "__main__":
    main()
