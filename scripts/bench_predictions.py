"""Predicted Outputs: edits whose prediction is the file being edited, each with the
prediction, without it (the server's default drafting) and plain, interleaved.

    python scripts/bench_predictions.py [--repeats 2] [--only rename-short,long-300] [--out FILE]

The set (written before the drafter's re-sync was measured on it, and not tuned on
since): renames, an added parameter, a reply in a fence, a reply after a sentence
the prediction lacks, a reply that drops a function, a changed constant, and a
300-line file (the first 300 lines of the standard library's textwrap.py, its reply
cut at --long-tokens). Each request runs as ``edgespec serve`` runs it (one
:class:`~edgespec.drafters.prediction.PredictedOutput` for all, auto mode, its
planner kept), greedy. Per request: the reply's tokens that continue the prediction
(each token of a run it shares with the prediction but the run's first), the
prediction tokens accepted, and decode tok/s with the prediction, without it and
plain, each run with or without it between two plain runs.
"""

from __future__ import annotations

import argparse
import difflib
import json
import statistics
import textwrap
from pathlib import Path

import edgespec
from edgespec.core.planner import AUTO
from edgespec.drafters.prediction import PredictedOutput

TWO = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
SIXTEEN = "\n".join(f"def f{i}(x):\n    return x * {i} + {i}\n" for i in range(16))
CONFIG = '''"""Settings for the importer."""

import os

RETRIES = 3
TIMEOUT_S = 30
BATCH = 64


def load(path):
    """Read the settings file at path."""
    with open(path) as f:
        return dict(line.strip().split("=", 1) for line in f if "=" in line)


def save(path, settings):
    """Write settings to path, one key=value a line."""
    with open(path, "w") as f:
        for key, value in sorted(settings.items()):
            f.write(f"{key}={value}\\n")


def merged(defaults, overrides):
    """Defaults with the overrides on top."""
    out = dict(defaults)
    out.update(overrides)
    return out


def from_env(prefix="APP_"):
    """The settings given in the environment."""
    return {k[len(prefix):].lower(): v for k, v in os.environ.items() if k.startswith(prefix)}
'''
LONG = "".join(Path(textwrap.__file__).read_text().splitlines(keepends=True)[:300])
WHOLE = " Give the whole file back, nothing else."
LONG_REPLY = 150  # tokens: a reply this long is a "long one" in the summary


def requests(long_tokens: int) -> list[dict]:
    """The set: name, prediction, ask and max tokens."""
    def ask(text, source):
        return f"{text}\n```python\n{source}```"
    return [
        dict(name="rename-short", prediction=TWO, max_tokens=64,
             ask=ask("Rename the function add to plus. Reply with the changed function in a "
                     "```python fence.", TWO)),
        dict(name="rename-all", prediction=SIXTEEN, max_tokens=600,
             ask=ask("Rename every function fN to gN in this file." + WHOLE, SIXTEEN)),
        dict(name="rename-one", prediction=SIXTEEN, max_tokens=600,
             ask=ask("Rename f5 to g5 in this file." + WHOLE, SIXTEEN)),
        dict(name="add-parameter", prediction=CONFIG, max_tokens=600,
             ask=ask("Add a parameter encoding='utf-8' to load and save, passed to open." + WHOLE, CONFIG)),
        dict(name="fenced", prediction=CONFIG, max_tokens=600,
             ask=ask("Change BATCH to 128. Give the whole file back in a ```python fence.", CONFIG)),
        dict(name="sentence-first", prediction=CONFIG, max_tokens=600,
             ask=ask("Change TIMEOUT_S to 60. First say in one sentence what you changed, then give "
                     "the whole file.", CONFIG)),
        dict(name="drop-function", prediction=CONFIG, max_tokens=600,
             ask=ask("Remove the function merged." + WHOLE, CONFIG)),
        dict(name="long-300", prediction=LONG, max_tokens=long_tokens,
             ask=ask("Rename the class TextWrapper to LineWrapper everywhere in this file." + WHOLE, LONG)),
    ]


def continuing(prediction: list[int], reply: list[int]) -> int:
    """The reply's tokens that continue the prediction: in each run the two share, every
    token but the run's first (what a drafter could have drafted, having seen the one before)."""
    blocks = difflib.SequenceMatcher(None, prediction, reply, autojunk=False).get_matching_blocks()
    return sum(max(0, b.size - 1) for b in blocks)


def run(engine, request, drafter, prediction=None):
    """One greedy reply: (decode tok/s, generation)."""
    messages = [{"role": "user", "content": request["ask"]}]
    options = dict(speculative=drafter is not None, drafter=drafter, num_draft=AUTO if drafter else 1)
    if prediction is not None:
        prediction.expect(engine.target.tokenize(request["prediction"], add_bos=False, special=False))
    g = engine.chat(messages, stream=False, temperature=0, max_tokens=request["max_tokens"], **options)
    return g.stats.generated_tokens / g.stats.decode_time_s, g


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--only", default="", help="comma-separated request names")
    parser.add_argument("--long-tokens", type=int, default=1024)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--draft", default="lookup", help="the server's default drafter")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    engine = edgespec.load(args.target, draft=args.draft, num_draft="auto", n_ctx=8192, fetch=True)
    default, prediction = engine.drafter, PredictedOutput()
    chosen = [r for r in requests(args.long_tokens) if not args.only or r["name"] in args.only.split(",")]
    results = []
    for request in chosen:
        row = {"name": request["name"], "plain": [], "without": [], "with": [],
               "vs_plain": [], "vs_without": []}
        for _ in range(args.repeats):  # plain, with, plain, without, plain: each between two plain runs
            before, _ = run(engine, request, None)
            with_speed, g = run(engine, request, prediction, prediction)
            middle, _ = run(engine, request, None)
            without_speed, _ = run(engine, request, default)
            after, _ = run(engine, request, None)
            row["plain"] += [before, middle, after]
            row["with"].append(with_speed)
            row["without"].append(without_speed)
            row["vs_plain"].append(with_speed / ((before + middle) / 2))
            row["vs_without"].append(with_speed / without_speed)
            predicted = engine.target.tokenize(request["prediction"], add_bos=False, special=False)
            row.update(reply=g.text, reply_tokens=g.stats.generated_tokens,
                       continuing=continuing(predicted, g.token_ids),
                       accepted=g.stats.accepted_per_drafter.get("prediction", 0),
                       drafted=g.stats.drafted_per_drafter.get("prediction", 0))
            print(f"{request['name']}: {with_speed:.1f} tok/s with the prediction, {without_speed:.1f} "
                  f"without, {before:.1f}/{middle:.1f}/{after:.1f} plain; {row['accepted']} accepted of "
                  f"{row['continuing']} continuing ({row['reply_tokens']} tokens)", flush=True)
        results.append(row)
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=1))
    print("\n| request | reply tokens | continuing | accepted | share | with / plain | with / without |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        share = r["accepted"] / r["continuing"] if r["continuing"] else float("nan")
        print(f"| {r['name']} | {r['reply_tokens']} | {r['continuing']} | {r['accepted']} | {share:.2f} | "
              f"{min(r['vs_plain']):.2f}-{max(r['vs_plain']):.2f} | "
              f"{min(r['vs_without']):.2f}-{max(r['vs_without']):.2f} |")
    total = sum(r["accepted"] for r in results) / max(1, sum(r["continuing"] for r in results))
    longs = [statistics.mean(r["vs_without"]) for r in results if r["reply_tokens"] >= LONG_REPLY]
    print(f"\naccepted / continuing over the set: {total:.2f}; long ones with / without: "
          f"{min(longs):.2f}-{max(longs):.2f}; lowest with / plain: "
          f"{min(min(r['vs_plain']) for r in results):.2f}")
    engine.close()


if __name__ == "__main__":
    main()
