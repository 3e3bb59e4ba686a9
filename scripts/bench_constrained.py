"""JSON-schema-constrained decoding: speculative (auto mode) against constrained plain
decoding, each speculative run between two plain runs of the same prompt, and the
mask's host time per committed token (Predicted Outputs: scripts/bench_predictions.py).

    python scripts/bench_constrained.py [--sets edit,chat] [--prompts 4] [--max-tokens 128]

The schema is {"answer": "..."}: the prompt's own answer inside JSON (the grammar
forces the frame), so the grammar constrains every token while the reply stays what
the set asks for.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import edgespec
from edgespec.core.grammar import Grammar
from edgespec.measure.prompt_sets import load_prompt_set
from edgespec.core.shaping import Shaping

SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"],
          "additionalProperties": False}


class TimedShaping(Shaping):
    """The shaping, its host time summed (the grammar's masks and the row updates)."""

    seconds = 0.0

    def admissible(self, context, drafts):
        start = time.perf_counter()
        try:
            return super().admissible(context, drafts)
        finally:
            TimedShaping.seconds += time.perf_counter() - start

    def apply(self, logits, context, drafts):
        start = time.perf_counter()
        try:
            return super().apply(logits, context, drafts)
        finally:
            TimedShaping.seconds += time.perf_counter() - start


def run(engine, messages, max_tokens, speculative, **options):
    g = engine.chat(messages, stream=False, temperature=0, max_tokens=max_tokens,
                    speculative=speculative, **options)
    return g.stats.generated_tokens / g.stats.decode_time_s, g


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default="edit,chat")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    args = parser.parse_args()
    engine = edgespec.load(args.target, draft=args.draft, num_draft="auto", n_ctx=4096, fetch=True)
    grammar = Grammar.json_schema(SCHEMA, strict=True)
    warm = [{"role": "user", "content": "Say hello."}]  # (the grammar's vocabulary, auto mode's costs)
    run(engine, warm, 16, True, shaping=Shaping(rule=grammar))
    run(engine, warm, 16, False, shaping=Shaping(rule=grammar))
    report = {}
    for name in args.sets.split(","):
        ratios, mask_ms = [], []
        for prompt in load_prompt_set(name)[:args.prompts]:
            messages = [{"role": "user", "content": prompt}]
            first, _ = run(engine, messages, args.max_tokens, False, shaping=Shaping(rule=grammar))
            TimedShaping.seconds = 0.0
            spec, g = run(engine, messages, args.max_tokens, True, shaping=TimedShaping(rule=grammar))
            mask_ms.append(1000 * TimedShaping.seconds / max(g.stats.generated_tokens, 1))
            last, _ = run(engine, messages, args.max_tokens, False, shaping=Shaping(rule=grammar))
            json.loads(g.text) if g.finish_reason == "stop" else None  # (a whole reply parses)
            ratios.append(spec / ((first + last) / 2))
            print(f"{name}: {spec / first:.2f}-{spec / last:.2f}x constrained plain "
                  f"({g.stats.generated_tokens} tokens, {g.stats.accepted}/{g.stats.drafted} accepted, "
                  f"mask+shaping {mask_ms[-1]:.2f} ms/token)", flush=True)
        geo = statistics.geometric_mean(ratios)
        report[name] = {"geomean": geo, "min": min(ratios), "max": max(ratios),
                        "mask_ms_per_token": statistics.mean(mask_ms)}
        print(f"== {name}: geomean {geo:.3f}x (min {min(ratios):.2f}, max {max(ratios):.2f}), "
              f"mask+shaping {statistics.mean(mask_ms):.2f} ms per token", flush=True)
    print(json.dumps(report, indent=1))
    engine.close()


if __name__ == "__main__":
    main()
