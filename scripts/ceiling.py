"""How much faster than plain decoding could any drafter make this target here?

For each prompt (each turn of a conversation set) this script decodes the
target's greedy reply, measures what its passes cost on this machine (v(n),
and c of a draft model), and computes two ceilings (see edgespec/measure/ceiling.py):
the speedup of a drafter that always knows the reply and costs nothing, and
that of a copying drafter (prompt lookup, the suffix drafter) that always
knows which copy is right. ``--measure`` also runs both, as drafters of the
real engine, between two plain decodings of the same prompt: the measured
speedup of a perfect drafter, as edgespec bench measures any other.

    python scripts/ceiling.py --prompts edit,edit-val --measure
    python scripts/ceiling.py --prompts edit-chain --draft qwen2.5-coder-0.5b-instruct

A draft model's own ceiling (every draft accepted, k tokens for k steps of c
and one pass of k + 1 tokens) is printed beside them: where c + v(k+1) - v(k)
exceeds one step, no k can pay, whatever it accepts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import edgespec
from edgespec.measure.ceiling import best_schedule, ceiling, copy_lengths
from edgespec.drafters.scheduled import ScheduledDrafter
from edgespec.planner.calibration import calibrate
from edgespec.measure.prompt_sets import load_conversations, turn_messages
from edgespec.core.prompting import chat_prompt_ids
from edgespec.core.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--draft", help="a draft model, for its cost c and its own ceiling")
    parser.add_argument("--prompts", default="edit,edit-val", help="prompt sets, comma-separated")
    parser.add_argument("--prompts-per-set", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--max-draft", type=int, default=64,
                        help="the longest draft considered (auto mode drafts up to 64 tokens)")
    parser.add_argument("--measure", action="store_true",
                        help="also run both perfect drafters in the engine, between two plain runs")
    parser.add_argument("--rpc", help="the target's layers on these rpc-servers (HOST:PORT,...)")
    parser.add_argument("--json", help="write every figure here")
    args = parser.parse_args()

    engine = edgespec.load(args.target, draft=None, rpc=args.rpc)
    target = engine.target
    drafts = []
    if args.draft:
        from edgespec.models.loading import BackendOptions, load_backend
        drafts = [("draft", load_backend(args.draft, BackendOptions()))]
    print("measuring v(n) and c ...", file=sys.stderr)
    cost = calibrate(target, drafts, sizes=range(1, args.max_draft + 2), repeats=7)
    v = {n: cost.v(n) for n in range(1, args.max_draft + 2)}
    print(f"plain step {cost.step_seconds * 1000:.1f} ms; "
          + " ".join(f"v({n})={v[n]:.2f}" for n in sorted(v) if n > 1))
    result = {"target": args.target, "step_seconds": cost.step_seconds, "v": v, "prompts": []}
    if drafts:
        c = cost.c("draft")
        best = max(range(1, args.max_draft + 1), key=lambda k: (k + 1) / (k * c + v[k + 1]))
        bound = (best + 1) / (best * c + v[best + 1])
        print(f"draft model: c = {c:.2f}; with every draft accepted, at best {bound:.3f}x plain (k = {best})")
        result.update(c=c, draft_model_ceiling=bound, draft_model_best_k=best)
        drafts[0][1].close()

    for set_name in args.prompts.split(","):
        for index, turns in enumerate(load_conversations(set_name)[:args.prompts_per_set]):
            messages = []
            for turn, user in enumerate(turns, 1):
                prompt = turn_messages(messages, user)
                row = _prompt(engine, chat_prompt_ids(target, prompt), args, v)
                row.update(set=set_name if turn == 1 else f"{set_name}@2+", index=index, turn=turn)
                result["prompts"].append(row)
                messages.append({"role": "assistant", "content": row.pop("text")})
                print(f"{row['set']}:{index} turn {turn}: {row['tokens']} tokens, copy {row['copy']:.3f}, "
                      f"any {row['any']:.3f}" + (f"; measured copy {row['measured_copy']:.3f}, "
                                                  f"any {row['measured_any']:.3f}, plain/plain "
                                                  f"{row['plain_spread']:.3f}" if args.measure else ""),
                      file=sys.stderr, flush=True)
    engine.close()

    keys = ["copy", "any"] + (["measured_copy", "measured_any", "plain_spread"] if args.measure else [])
    print(f"\n{'set':16s} {'n':>3s} " + " ".join(f"{k:>22s}" for k in keys))
    for set_name in dict.fromkeys(r["set"] for r in result["prompts"]):
        rows = [r for r in result["prompts"] if r["set"] == set_name]
        cells = []
        for k in keys:
            values = [r[k] for r in rows]
            geo = statistics.geometric_mean(values)
            cells.append(f"{geo:.3f} ({min(values):.2f}-{max(values):.2f})")
        print(f"{set_name:16s} {len(rows):3d} " + " ".join(f"{c:>22s}" for c in cells))
    print("copy: a copying drafter that always knows the right copy; any: a drafter that knows the\n"
          "reply and costs nothing. Geometric mean over the prompts (min-max); measured: run by the\n"
          "engine between two plain decodings (plain/plain: the second plain run's speed to the first's).")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


def _prompt(engine, prompt_ids, args, v) -> dict:
    """The greedy reply to one prompt, its two ceilings, and (--measure) both measured."""
    plain = engine.generate(prompt_ids, GREEDY, max_tokens=args.max_tokens, speculative=False)
    reply = plain.token_ids
    runs = {"copy": copy_lengths(prompt_ids, reply, args.max_draft),
            "any": [args.max_draft] * len(reply)}
    row = {"tokens": len(reply), "text": plain.text, "prompt_ids": list(prompt_ids), "reply_ids": reply,
           **{name: ceiling(r, v.__getitem__) for name, r in runs.items()}}
    if args.measure:
        speeds = {}
        for name, r in runs.items():
            schedule, _ = best_schedule(r, v.__getitem__)
            engine.configure(ScheduledDrafter(reply, schedule), args.max_draft)
            g = engine.generate(prompt_ids, GREEDY, max_tokens=args.max_tokens)
            speeds[name] = g.stats.tokens_per_second
            row[f"parted_{name}"] = g.token_ids != reply  # a near-tie rounded the other way
        again = engine.generate(prompt_ids, GREEDY, max_tokens=args.max_tokens, speculative=False)
        base = statistics.mean([plain.stats.tokens_per_second, again.stats.tokens_per_second])
        row.update({f"measured_{name}": s / base for name, s in speeds.items()},
                   plain_spread=again.stats.tokens_per_second / plain.stats.tokens_per_second)
    return row


if __name__ == "__main__":
    main()
