"""How far a batched verify pass and one-token steps round apart, and the near-tie it sets.

On llama.cpp's fast CPU kernels (and on a GPU) a verify pass of n tokens and n one-token
steps give logits that differ by rounding. Each of the two best logits may move by that
much, so where plain decoding's top-2 gap is under twice the largest difference, a
speculative run may take the other branch. This prints that largest difference (the
drift) for each model over the passes speculation makes (2 to 65 tokens, after the
prompts of ``edgespec verify`` and a long code prompt), and the near-tie, 2 × drift.

    python scripts/near_tie.py -m smollm2-135m-instruct -m qwen2.5-coder-0.5b-instruct \
        -m qwen2.5-coder-1.5b-instruct [--json near-tie.json]

The figure the docs and the tests use is ``edgespec.measure.selfcheck.NEAR_TIE``: the
largest near-tie this printed, rounded up to a tenth.
"""

from __future__ import annotations

import argparse
import json
import math

from edgespec.backends.kernels import pass_difference
from edgespec.core.prompting import chat_prompt_ids
from edgespec.measure.prompt_sets import load_prompt_set
from edgespec.measure.selfcheck import NEAR_TIE, PROMPTS
from edgespec.models.loading import BackendOptions, load_backend

SIZES = (2, 3, 5, 9, 17, 33, 65)  # verify passes: k + 1 tokens, auto mode's long copies included


def drift(spec: str, threads: int | None) -> dict:
    """The largest |logit difference| between passes of :data:`SIZES` tokens and as
    many one-token steps, over the end of each prompt, on ``spec``'s fast kernels."""
    target = load_backend(spec, BackendOptions(n_ctx=4096, n_threads=threads, kernels="fast", fetch=True))
    try:
        prompts = [*PROMPTS, load_prompt_set("edit")[0]]
        worst = {}
        for prompt in prompts:
            ids = chat_prompt_ids(target, [{"role": "user", "content": prompt}])
            for n in SIZES:
                base = max(1, len(ids) - n)
                worst[n] = max(worst.get(n, 0.0), pass_difference(target, ids[:base], ids[base:base + n]))
        largest = max(worst.values())
        return {"model": spec, "drift_per_pass_size": {str(n): round(d, 4) for n, d in worst.items()},
                "drift": round(largest, 4), "near_tie": round(2 * largest, 4)}
    finally:
        target.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", action="append", required=True, help="a model (repeatable)")
    parser.add_argument("-t", "--threads", type=int, default=None)
    parser.add_argument("--json", default=None, help="write the figures as JSON")
    args = parser.parse_args()
    rows = [drift(spec, args.threads) for spec in args.model]
    for row in rows:
        print(f"{row['model']:32} drift {row['drift']:.3f}  near-tie {row['near_tie']:.3f}  "
              f"by pass size {row['drift_per_pass_size']}")
    largest = max(row["near_tie"] for row in rows)
    print(f"largest near-tie {largest:.3f} -> rounded up {math.ceil(largest * 10) / 10:.1f} "
          f"(NEAR_TIE in edgespec/measure/selfcheck.py: {NEAR_TIE})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"models": rows, "largest_near_tie": largest}, f, indent=1)


if __name__ == "__main__":
    main()
