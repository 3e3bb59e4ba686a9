"""Do fresh runs of one request decide alike? Auto mode's decisions, round by round, in
N fresh processes, each with a new ``$EDGESPEC_HOME`` (so each calibrates and times its
long passes itself, as a first run on a machine does), and the first round where two
runs part, with what each believed there: the costs it started from and the costs at
that round.

    python scripts/decisions.py --prompts client-val --index 4 --runs 3 --max-tokens 1024 --ctx 8192
    python scripts/decisions.py --prompts edit-val --index 2 --runs 3 --json bench-out/decisions.json
    python scripts/decisions.py --prompts client-val --index 4 --runs 1 --replay

``--replay``: run 1 again, in another fresh home, from run 1's starting costs and with its
clock's readings (:mod:`edgespec.measure.replay`): the same decisions and text show that
what moved the other runs was the clock.

The text is greedy (T = 0), so it is the same in every run up to a near-tie; what can
differ is what was drafted and verified on the way, which only costs read off the clock
decide. Not a benchmark: each run's tok/s is printed for scale only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SIZES = (2, 5, 9, 17, 33, 65)  # the pass sizes whose believed cost is printed


def child(args) -> None:
    """One generation in this process (its EDGESPEC_HOME set by the parent): every
    round's decision and the costs behind it, written as JSON to ``args.child``."""
    import edgespec
    from edgespec.core.prompting import chat_prompt_ids
    from edgespec.core.sampling import SamplingParams
    from edgespec.measure.prompt_sets import load_conversations, turn_messages
    from edgespec.measure.replay import RecordingClock, ReplayingClock, record_decisions

    replayed = json.loads(Path(args.replay_of).read_text()) if args.replay_of else None
    clock = ReplayingClock(replayed["readings"]) if replayed else RecordingClock()
    prior = {"v": replayed["started"]["prior_v"], "c": replayed["started"]["prior_c"]} if replayed else None
    engine = edgespec.load(args.target, draft=None if args.draft == "none" else args.draft,
                           n_ctx=args.ctx, prior=prior, clock=clock)
    cost = engine.planner.cost
    started = {"prior_v": {str(n): v for n, v in sorted(cost.prior_v.items())}, "prior_c": cost.prior_c}

    def costs(result) -> dict:
        step = cost.step_seconds or 0.0
        return {"pass_steps": round(result.target_seconds / step, 3) if step else None,
                "v": {str(n): round(cost.v(n), 3) for n in SIZES}}

    rounds = record_decisions(engine.planner, costs)
    conversation = load_conversations(args.prompts)[args.index]
    messages = turn_messages([], conversation[0])
    ids = chat_prompt_ids(engine.target, messages)
    generation = engine.generate(ids, SamplingParams(temperature=0), max_tokens=args.max_tokens)
    stats = generation.stats
    Path(args.child).write_text(json.dumps({
        "started": started, "rounds": rounds, "token_ids": generation.token_ids,
        "readings": clock.readings,
        "stats": {"tokens_per_second": stats.tokens_per_second, "drafted": stats.drafted,
                  "accepted": stats.accepted, "rounds": stats.rounds, "plain_steps": stats.plain_steps}}))
    engine.close()


def first_parting(a: list[dict], b: list[dict]) -> int | None:
    """The first round where two runs decided otherwise (drafter, draft length, or what
    was offered), or None."""
    key = lambda r: (r["drafter"], r["drafted"], r["offered"], r["accepted"])  # noqa: E731
    return next((i for i, (x, y) in enumerate(zip(a, b)) if key(x) != key(y)),
                None if len(a) == len(b) else min(len(a), len(b)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--draft", default="none", help="a draft model, or none (what serve runs on a CPU)")
    parser.add_argument("--prompts", default="client-val", help="a prompt, conversation or request set")
    parser.add_argument("--index", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--ctx", type=int, default=8192)
    parser.add_argument("--replay", action="store_true",
                        help="then run 1 again from its starting costs and clock readings")
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--replay-of", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)

    sys.path.insert(0, str(Path(__file__).parent))
    from stability import fresh_home  # a new EDGESPEC_HOME, the weights linked in
    runs, replay = [], None
    with tempfile.TemporaryDirectory() as tmp:
        def fresh_run(name: str, *extra: str) -> dict:
            home = fresh_home(Path(tmp), name)
            out = Path(tmp) / f"{name}.json"
            command = [sys.executable, __file__, "--child", str(out), "--target", args.target,
                       "--draft", args.draft, "--prompts", args.prompts, "--index", str(args.index),
                       "--max-tokens", str(args.max_tokens), "--ctx", str(args.ctx), *extra]
            subprocess.run(command, check=True, env={**os.environ, "EDGESPEC_HOME": str(home)})
            return json.loads(out.read_text())

        for run in range(args.runs):
            runs.append(fresh_run(f"run-{run}"))
            s = runs[-1]["stats"]
            print(f"run {run + 1}: {s['tokens_per_second']:.2f} tok/s, {s['rounds']} rounds, "
                  f"{s['plain_steps']} plain steps, drafted {s['drafted']}, accepted {s['accepted']}; "
                  f"started from v " + " ".join(f"{n}:{v}" for n, v in runs[-1]["started"]["prior_v"].items()),
                  flush=True)
        if args.replay:
            replay = fresh_run("replay", "--replay-of", str(Path(tmp) / "run-0.json"))
    first = runs[0]
    if replay is not None:
        at = first_parting(first["rounds"], replay["rounds"])
        same = "the same text" if replay["token_ids"] == first["token_ids"] else "another text"
        print(f"replay of run 1 (its starting costs, its {len(first['readings'])} clock readings): "
              + (f"the same {len(first['rounds'])} decisions, {same}" if at is None
                 else f"parts at round {at}, {same}"))
    for number, other in enumerate(runs[1:], 2):
        same_text = other["token_ids"] == first["token_ids"]
        at = first_parting(first["rounds"], other["rounds"])
        if at is None:
            print(f"run {number}: the same decisions as run 1 (text {'the same' if same_text else 'differs'})")
            continue
        print(f"run {number} parts from run 1 at round {at} (text {'the same' if same_text else 'differs'}):")
        for name, rounds in (("run 1", first["rounds"]), (f"run {number}", other["rounds"])):
            window = rounds[max(0, at - 2):at + 1]
            for i, r in enumerate(window, max(0, at - 2)):
                print(f"  {name} round {i}: {r['drafter'] or 'plain'} {r['bucket'] or ''} drafted "
                      f"{r['drafted']} accepted {r['accepted']} offered {r['offered']} pass "
                      f"{r['pass']} ({r['pass_steps']} steps) v {r['v']}")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
