"""Does auto mode stay stable across fresh processes that share a cost cache?

Runs ``edgespec generate`` (auto mode, the default pairing) N times in fresh
processes that share one ``$EDGESPEC_HOME`` (so each run starts from the costs
the runs before it cached), for a code-editing and a chat prompt, with plain
decoding (``--no-spec``) of the same prompt before and after every auto run as
the yardstick. Prints tok/s per run, run N against run 1, and each run against
the plain runs around it; and, for scale, how far each plain run strays from the
plain runs around it (identical work: this machine's noise), and which auto runs
made the same decisions as run 1 (rounds, plain steps, drafted, accepted).

    python scripts/stability.py --runs 10 --json bench-out/stability.json
    python scripts/stability.py --draft none --prompts client-val:0 --runs 6 --max-tokens 4096 --ctx 8192
    python scripts/stability.py --draft none --prompts client-val:5 --runs 5 --fresh

``--fresh``: each auto run in a new ``$EDGESPEC_HOME`` (the weights linked in), as a user's
first run on a machine: it calibrates and times its long passes itself. The costs each
run started from and saved are printed beside what it did.

A request set's entry (``client-val:0``) is sent as the client sent it (``--messages``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from edgespec.paths import edgespec_home
from edgespec.measure.prompt_sets import REQUEST_SETS, load_conversations, load_prompt_set


def generate(prompt: list[str], home: Path, args, *extra: str) -> dict:
    command = [sys.executable, "-m", "edgespec", "generate", "-m", args.target, "-d", args.draft,
               *prompt, "--temp", "0", "--max-tokens", str(args.max_tokens), "--ctx", str(args.ctx),
               "--json", *extra]
    out = subprocess.run(command, capture_output=True, text=True,
                         env={**os.environ, "EDGESPEC_HOME": str(home)})
    if out.returncode != 0:
        raise SystemExit(f"edgespec generate failed:\n{out.stderr}")
    return json.loads(out.stdout)["stats"]


def fresh_home(parent: Path, run: int | str) -> Path:
    """A new EDGESPEC_HOME under ``parent`` with the weights linked in and nothing else."""
    home = parent / f"fresh-{run}"
    home.mkdir()
    (home / "models").symlink_to(edgespec_home() / "models")
    return home


def _work(stats: dict) -> tuple:
    """What a run did, as opposed to how fast the machine was while it did it."""
    return stats["rounds"], stats["plain_steps"], stats["drafted"], stats["accepted"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    # Replies that run to the 128-token cap at T = 0 (edit-val:1 and chat-val:0, the
    # defaults before, end after 71 and 56 tokens: 5 s of timing, which this 2-core
    # machine measures +-10% apart for identical work).
    parser.add_argument("--prompts", default="edit-val:4,chat-val:3",
                        help="SET:INDEX,... (default: one code-editing and one chat prompt)")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--fresh", action="store_true",
                        help="each auto run in a new EDGESPEC_HOME: nothing cached from the runs before")
    parser.add_argument("--json")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        (home / "models").symlink_to(edgespec_home() / "models")  # the weights, not the costs
        for spec in args.prompts.split(","):
            set_name, index = spec.split(":")
            if set_name in REQUEST_SETS:  # a captured request: its messages as the client sent them
                path = home / f"{set_name}-{index}.json"
                path.write_text(json.dumps(load_conversations(set_name)[int(index)][0]))
                prompt = ["--messages", str(path)]
            else:
                prompt = ["-p", load_prompt_set(set_name)[int(index)]]
            # plain, auto, plain, auto, ..., plain: each auto run is compared with the
            # plain runs on either side of it, so that a machine drifting over minutes
            # is not read as auto mode's doing.
            plain = [generate(prompt, home, args, "--no-spec")["tokens_per_second"]]
            auto = []
            for run in range(args.runs):
                own = fresh_home(home, run) if args.fresh else home
                stats = generate(prompt, own, args)
                if args.fresh:
                    stats["saved_costs"] = [json.loads(p.read_text())
                                            for p in sorted((own / "calibration").glob("*.json"))]
                auto.append(stats)
                plain.append(generate(prompt, home, args, "--no-spec")["tokens_per_second"])
                base = (plain[-2] + plain[-1]) / 2
                print(f"{spec} run {run + 1}: {stats['tokens_per_second']:.2f} tok/s "
                      f"({stats['tokens_per_second'] / base:.3f} x the plain runs around it, "
                      f"{base:.2f}), {stats['rounds']} rounds, {stats['plain_steps']} plain steps "
                      f"({stats['rounds_per_drafter']})", flush=True)
            speeds = [s["tokens_per_second"] for s in auto]
            vs_plain = [speed / ((plain[i] + plain[i + 1]) / 2) for i, speed in enumerate(speeds)]
            # What identical work measures on this machine: each inner plain run against the
            # plain runs either side of it. Auto runs spread no wider than this are stable.
            noise = [plain[i] / ((plain[i - 1] + plain[i + 1]) / 2) for i in range(1, len(plain) - 1)]
            same_work = [_work(s) == _work(auto[0]) for s in auto]
            spread = f"{min(noise):.3f}-{max(noise):.3f}" if noise else "(one auto run: none)"
            results[spec] = {"plain_tokens_per_second": plain, "auto": auto,
                             "last_vs_first": speeds[-1] / speeds[0], "vs_plain": vs_plain,
                             "last_vs_first_vs_plain": vs_plain[-1] / vs_plain[0],
                             "plain_vs_neighbours": noise, "same_work_as_run_1": same_work}
            print(f"{spec}: run {args.runs} / run 1 = {speeds[-1] / speeds[0]:.3f} in tok/s, "
                  f"{vs_plain[-1] / vs_plain[0]:.3f} against the plain runs around each; "
                  f"auto / the plain runs around it: min {min(vs_plain):.3f}, median "
                  f"{statistics.median(vs_plain):.3f}, max {max(vs_plain):.3f}; plain runs "
                  f"{min(plain):.2f}-{max(plain):.2f} tok/s, each against its neighbours "
                  f"{spread}; runs that did run 1's work "
                  f"(rounds, plain steps, drafted, accepted): {sum(same_work)} of {len(auto)}",
                  flush=True)
            cost_files = sorted((home / "calibration").glob("*.json"))
            results[spec]["cached_costs"] = [json.loads(p.read_text()) for p in cost_files]
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
