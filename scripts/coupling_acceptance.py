"""How often a draft model's token is accepted, seed-invariant sampling against the exact rule.

Along each prompt's greedy reply (a built-in prompt set), the target's and the draft
model's rows are recorded, teacher-forced; at each position and temperature this
prints the exact rule's acceptance, sum(min(p, q)), and seed-invariant sampling's,
P(the race under q picks the race under p's winner), estimated over many seeds.

    python scripts/coupling_acceptance.py --sets code,chat --temps 0.7,1.0
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

import edgespec
from edgespec.core.coupling import race
from edgespec.measure.prompt_sets import load_prompt_set
from edgespec.core.prompting import chat_prompt_ids
from edgespec.core.sampling import SamplingParams, logits_to_probs, weights_and_blocks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--sets", default="code,chat")
    parser.add_argument("--prompts-per-set", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64, help="reply tokens per prompt")
    parser.add_argument("--temps", default="0.7,1.0")
    parser.add_argument("--seeds", type=int, default=100, help="races per row")
    args = parser.parse_args()

    engine = edgespec.load(args.target, draft=args.draft, num_draft=4)
    target, draft = engine.target_cache, engine.drafter.cache
    temps = [float(t) for t in args.temps.split(",")]
    exact = {t: [] for t in temps}
    invariant = {t: [] for t in temps}
    for set_name in args.sets.split(","):
        for prompt in load_prompt_set(set_name)[:args.prompts_per_set]:
            ids = chat_prompt_ids(engine.target, [{"role": "user", "content": prompt}])
            reply = engine.generate(ids, SamplingParams(temperature=0), max_tokens=args.tokens,
                                    speculative=False).token_ids
            rows = []
            for cache in (target, draft):
                cache.sync(ids[:-1], need_logits=False)
                rows.append(np.array(cache.forward(ids[-1:] + reply[:-1])))
                cache.rewind(0)
            vocab = min(r.shape[-1] for r in rows)
            for temperature in temps:
                params = SamplingParams(temperature=temperature)
                for position, (p_row, q_row) in enumerate(zip(rows[0][:, :vocab], rows[1][:, :vocab])):
                    p = logits_to_probs(p_row, params)
                    q = logits_to_probs(q_row, params)
                    exact[temperature].append(float(np.minimum(p, q).sum()))
                    pw, pb = weights_and_blocks(p_row, params)
                    qw, qb = weights_and_blocks(q_row, params)
                    same = sum(race(pw, pb, seed, position) == race(qw, qb, seed, position)
                               for seed in range(args.seeds))
                    invariant[temperature].append(same / args.seeds)
            print(f"{set_name}: {len(reply)} tokens recorded", flush=True)
    engine.close()
    print(f"\nper-token acceptance of {args.draft}'s tokens by {args.target} "
          f"({len(exact[temps[0]])} positions, {args.seeds} races each)")
    print(f"{'T':>5s} {'exact rule':>11s} {'seed-invariant':>15s} {'ratio':>7s}")
    for t in temps:
        e, i = statistics.mean(exact[t]), statistics.mean(invariant[t])
        print(f"{t:5.2f} {e:11.3f} {i:15.3f} {i / e:7.3f}")


if __name__ == "__main__":
    main()
