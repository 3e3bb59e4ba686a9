"""Trace auto mode round by round on one real generation: what it chose, and why.

``planner_sim.py`` replays the planner on recorded traces with the calibration's
costs; this runs the real engine, set up as ``edgespec chat`` sets it up, and prints
after each round what was drafted and accepted and what the planner believed when it
made its next decision: each draft model's expected speed in step with the text and
with the catch-up it owes, its acceptance estimates, the exploration budget and the
draft model's stop. A diagnosis tool for where the real engine and the sim part
ways. Not a benchmark.

    python scripts/auto_trace.py --prompts code --index 0 --temp 0
    python scripts/auto_trace.py --prompts edit-chain-val --index 1 --turn 2 --draft none

A conversation's earlier turns are answered by plain decoding first (as bench_ngram.py
does), with one planner carried over the turns as in a chat; the last turn is traced.
"""

from __future__ import annotations

import argparse

import edgespec
from edgespec.core.draft import MODEL
from edgespec.planner import RoundResult
from edgespec.measure.prompt_sets import load_conversations, turn_messages
from edgespec.core.prompting import chat_prompt_ids
from edgespec.core.sampling import SamplingParams


def trace(planner) -> None:
    """Print the planner's beliefs after each round it observes (from now on)."""
    observe, position = planner.observe, [0]

    def traced(result: RoundResult) -> None:
        observe(result)
        beliefs = []
        for drafter in planner.drafters:
            name = drafter.name
            if drafter.kind != MODEL:
                continue
            behind = planner._state[name].behind
            in_step = planner.best_k(name, name, planner.max_draft)
            owed = planner.best_k(name, name, planner.max_draft, behind=behind)
            alpha = " ".join(f"{a:.2f}" for a in planner.tracker(name).alpha[:4])
            offer = " ".join(f"{o:.2f}" for o in planner.tracker(name)._offers(4, 0.0))
            beliefs.append(f"{name[:12]}: k={in_step[0]} {in_step[1]:.3f}x in step, "
                           f"{owed[1]:.3f}x behind {behind}; alpha {alpha}; offer {offer}")
        step = planner.cost.step_seconds or 0.0
        timed = result.target_seconds / step if step else 0.0  # this pass, in plain steps
        print(f"t={position[0]:4d} {(result.drafter or 'plain')[:12]:12s} {result.bucket or '':8s} "
              f"drafted {result.num_drafted:2d} accepted {result.num_accepted:2d}  "
              f"pass {timed:5.2f} v({result.target_tokens})={planner.cost.v(result.target_tokens):5.2f} "
              f"[v 9/17/33/65: " + "/".join(f"{planner.cost.v(n):.1f}" for n in (9, 17, 33, 65)) + "]  "
              f"budget {planner.exploration:5.2f} stop {planner.stop_at:.2f}  " + " | ".join(beliefs))
        position[0] += result.num_committed

    planner.observe = traced


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct",
                        help="a draft model, or none (prompt lookup alone, as chat on a CPU)")
    parser.add_argument("--prompts", default="code", help="a built-in prompt or conversation set")
    parser.add_argument("--index", type=int, default=0, help="which prompt of the set")
    parser.add_argument("--turn", type=int, default=1, help="which turn of a conversation to trace")
    parser.add_argument("--temp", type=float, default=0.0)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--ctx", type=int, default=4096)
    args = parser.parse_args()

    engine = edgespec.load(args.target, draft=None if args.draft == "none" else args.draft,
                           n_ctx=args.ctx)
    planner = engine.planner  # auto mode from the cached costs, as chat builds it
    turns = load_conversations(args.prompts)[args.index][:args.turn]
    params = SamplingParams(temperature=args.temp, seed=0)
    messages = []
    for number, user in enumerate(turns, 1):
        ids = chat_prompt_ids(engine.target, turn_messages(messages, user))
        if number == len(turns):
            trace(planner)
        generation = engine.generate(ids, params, max_tokens=args.max_tokens,
                                     speculative=number == len(turns))
        messages.append({"role": "assistant", "content": generation.text})
    stats = generation.stats
    print(f"{stats.generated_tokens} tokens, {stats.tokens_per_second:.2f} tok/s, "
          f"{stats.rounds} rounds, {stats.plain_steps} plain steps")
    engine.close()


if __name__ == "__main__":
    main()
