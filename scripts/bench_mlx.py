"""Benchmark edgespec on MLX next to mlx-lm's own speculative decoding.

The Qwen2.5-Coder GGUF pair is converted to MLX once (cached) and, for each
prompt and temperature, these run one after the other on the same loaded
models: edgespec plain, edgespec with the draft model, edgespec with prompt
lookup, and mlx-lm's ``speculative_generate_step`` with the same k. At
temperature > 0, mlx-lm accepts a draft only when the target's own sample
equals it; exact rejection sampling accepts with probability min(1, p/q), so
its acceptance rate should be higher. On Linux MLX runs on the CPU, slowly:
tok/s here says little about a Mac; acceptance and greedy equality do.

    python scripts/bench_mlx.py --prompts 1 --max-tokens 32
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import speculative_generate_step
from mlx_lm.sample_utils import make_sampler
from rich.console import Console
from rich.table import Table

from edgespec import DraftModel, Engine, PromptLookup, SamplingParams
from edgespec.models.loading import BackendOptions, load_backend
from edgespec.measure.prompt_sets import load_prompt_set
from edgespec.core.prompting import chat_prompt_ids


def mlx_lm_speculative(target, draft, prompt_ids, *, num_draft, max_tokens, temperature, seed):
    """One mlx-lm speculative generation; returns tokens, drafted, accepted, tok/s."""
    mx.random.seed(seed)
    steps = speculative_generate_step(mx.array(prompt_ids, mx.uint32), target.model, draft.model,
                                      num_draft_tokens=num_draft, max_tokens=max_tokens,
                                      sampler=make_sampler(temp=temperature))
    tokens, flags = [], []
    start = None
    for token, _, from_draft in steps:
        if start is None:
            start = time.perf_counter()  # after prefill, like edgespec's decode rate
        tokens.append(int(token))
        flags.append(bool(from_draft))
    elapsed = time.perf_counter() - start
    # Every mlx-lm round drafts min(k, tokens left) and ends with one target token.
    drafted, produced, round_start = 0, 0, True
    for from_draft in flags:
        if round_start:
            drafted += min(num_draft, max_tokens - produced)
            round_start = False
        produced += 1
        if not from_draft:
            round_start = True
    return tokens, drafted, sum(flags), (len(tokens) - 1) / elapsed if elapsed > 0 else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--sets", default="code,edit,chat")
    parser.add_argument("--prompts", type=int, default=1, help="prompts per set")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--num-draft", type=int, default=4)
    parser.add_argument("--temps", default="0,0.7")
    parser.add_argument("--seeds", type=int, default=1, help="samples per prompt at temperature > 0")
    parser.add_argument("--mlx-quantize", default="4bit", choices=("4bit", "8bit", "none"))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    console = Console(width=150)

    options = BackendOptions(backend="mlx", n_ctx=4096, fetch=True, mlx_quantize=args.mlx_quantize)
    t0 = time.perf_counter()
    target = load_backend(args.target, options, name=args.target)
    draft = load_backend(args.draft, options, name=args.draft)
    console.print(f"loaded both models on MLX ({mx.default_device()}) in {time.perf_counter() - t0:.0f} s")
    engine = Engine(target, None, num_draft=args.num_draft)
    drafters = {"draft": DraftModel(draft), "lookup": PromptLookup()}

    rows = []
    for temperature in (float(t) for t in args.temps.split(",")):
        seeds = range(args.seeds if temperature > 0 else 1)
        for set_name in args.sets.split(","):
            for index, prompt in enumerate(load_prompt_set(set_name)[:args.prompts]):
                ids = chat_prompt_ids(target, [{"role": "user", "content": prompt}])
                for seed in seeds:
                    params = SamplingParams(temperature=temperature, seed=seed)
                    result = {}
                    for mode in ("plain", "draft", "lookup"):
                        engine.set_drafter(drafters.get(mode))
                        g = engine.generate(ids, params, max_tokens=args.max_tokens,
                                            speculative=mode != "plain")
                        result[mode] = (g.token_ids, g.stats.drafted, g.stats.accepted,
                                        g.stats.tokens_per_second)
                    # mlx-lm makes its own caches; ours stay as they are.
                    result["mlx-lm"] = mlx_lm_speculative(
                        target, draft, ids, num_draft=args.num_draft, max_tokens=args.max_tokens,
                        temperature=temperature, seed=seed)
                    for mode, (tokens, drafted, accepted, tps) in result.items():
                        rows.append({"temp": temperature, "set": set_name, "prompt": index,
                                     "seed": seed, "mode": mode, "tokens": tokens, "drafted": drafted,
                                     "accepted": accepted, "tok_s": tps,
                                     "same_as_plain": tokens == result["plain"][0]})
                    console.print(f"T={temperature} {set_name}[{index}] seed {seed}: " + ", ".join(
                        f"{m} {r[3]:.2f} tok/s acc {r[2]}/{r[1]}" for m, r in result.items()))
    report(console, rows, args)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


def report(console: Console, rows: list[dict], args) -> None:
    table = Table(title=f"edgespec vs mlx-lm on MLX — k={args.num_draft}, {args.max_tokens} tokens")
    for column in ("temp", "mode", "tok/s (median)", "× plain", "drafted", "accepted",
                   "acceptance", "greedy = plain"):
        table.add_column(column, justify="right")
    for temperature in dict.fromkeys(r["temp"] for r in rows):
        plain = statistics.median(r["tok_s"] for r in rows if r["temp"] == temperature
                                  and r["mode"] == "plain")
        for mode in ("plain", "draft", "lookup", "mlx-lm"):
            mine = [r for r in rows if r["temp"] == temperature and r["mode"] == mode]
            drafted, accepted = sum(r["drafted"] for r in mine), sum(r["accepted"] for r in mine)
            tps = statistics.median(r["tok_s"] for r in mine)
            table.add_row(f"{temperature:g}", "edgespec " + mode if mode != "mlx-lm" else "mlx-lm spec",
                          f"{tps:.2f}", f"{tps / plain:.2f}", str(drafted), str(accepted),
                          f"{accepted / drafted:.1%}" if drafted else "",
                          f"{sum(r['same_as_plain'] for r in mine)}/{len(mine)}" if temperature == 0 else "n/a")
    console.print(table)


if __name__ == "__main__":
    sys.exit(main())
