"""The target behind rpc-servers, at several network delays: how speculation's gain grows.

For each added round-trip time (default 0, 2, 5, 10 ms), start two local
rpc-servers, each behind a proxy that adds that delay (``rpc_servers.py``),
and run ``edgespec bench --rpc`` on them in a fresh process: plain decoding,
fixed k and auto mode, interleaved per prompt as ``edgespec bench`` does, the
draft model on this machine. Then one table: speedup over plain (median over
prompts, min–max) per delay, set and mode, and the plain speed itself.

    python scripts/bench_rpc.py --out bench-out/rpc          # ~35 min on 2 cores

Each delay's full ``edgespec bench`` JSON is kept in ``--out``. Needs a
llama-cpp-python built with RPC and ``python scripts/rpc_servers.py --build``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llamacpp_reference import build_rpc_server  # noqa: E402
from rpc_servers import LocalRpcServers  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delays", default="0,2,5,10", help="added round-trip times, ms")
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--drafters", default="qwen2.5-coder-0.5b-instruct,lookup")
    parser.add_argument("--num-draft", default="4")
    parser.add_argument("--temp", default="0")
    parser.add_argument("--prompts", default="edit,chat")
    parser.add_argument("--prompts-per-set", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads of each server")
    parser.add_argument("--out", type=Path, default=Path("bench-out/rpc"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    binary = build_rpc_server()
    results = {}
    for delay in (float(d) for d in args.delays.split(",")):
        path = args.out / f"delay-{delay:g}ms.json"
        with LocalRpcServers(binary, 2, threads=args.threads, delay_ms=delay) as servers:
            print(f"added RTT {delay:g} ms: --rpc {','.join(servers.endpoints)}", flush=True)
            subprocess.run([sys.executable, "-m", "edgespec", "bench", "--target", args.target,
                            "--drafters", args.drafters, "--num-draft", args.num_draft,
                            "--temp", args.temp, "--prompts", args.prompts,
                            "--prompts-per-set", str(args.prompts_per_set),
                            "--max-tokens", str(args.max_tokens),
                            "--rpc", ",".join(servers.endpoints), "--json", str(path)],
                           check=True)
        results[delay] = json.loads(path.read_text())
    print_table(results)
    return 0


def print_table(results: dict[float, dict]) -> None:
    print("\nspeedup over plain decoding, target on 2 rpc-servers (geometric mean over prompts, min–max)")
    print(f"{'RTT ms':>6}  {'set':<10} {'T':>3}  {'mode':<34} {'speedup':>7}  {'min–max':<11}  plain tok/s")
    for delay, result in results.items():
        plain = {(s["prompt_set"], s["temperature"]): s["tokens_per_second"]
                 for s in result["summary"] if s["mode"] == "plain"}
        for s in result["summary"]:
            if s["mode"] == "plain":
                continue
            mode = f"{s['drafter']}" + (f" k={s['num_draft']}" if s["mode"] == "fixed" else "")
            key = (s["prompt_set"], s["temperature"])
            print(f"{delay:>6g}  {s['prompt_set']:<10} {s['temperature']:>3g}  {mode[:34]:<34} "
                  f"{s['speedup_geomean']:>7.3f}  {s['speedup_min']:.2f}–{s['speedup_max']:.2f}    "
                  f"{plain.get(key, float('nan')):.2f}")
    v = {d: r["costs"] for d, r in results.items()}
    for delay, costs in v.items():
        print(f"RTT {delay:g} ms: costs {costs}")


if __name__ == "__main__":
    sys.exit(main())
