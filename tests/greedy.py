"""Comparing greedy outputs of real models, where kernels may round differently.

On llama.cpp's fast CPU kernels a batched pass (a speculative round's verify) and a
one-token pass (plain decoding) round differently: at a near-tie between the two best
tokens (a top-2 logit gap under ``NEAR_TIE``, the figure the docs give, measured by
``scripts/near_tie.py``), greedy speculative output may take the other branch than
plain greedy output. Anywhere else the two must agree exactly.
"""

from __future__ import annotations

import numpy as np

from edgespec.measure.selfcheck import NEAR_TIE  # noqa: F401 - the tests' allowance, from here


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where two token lists differ (one ending counts), or None."""
    return next((i for i in range(max(len(a), len(b)))
                 if i >= len(a) or i >= len(b) or a[i] != b[i]), None)


def assert_equal_up_to_a_near_tie(engine, prompt_ids: list[int], plain_ids: list[int],
                                  spec_ids: list[int], near_tie: float = NEAR_TIE) -> None:
    """``spec_ids`` equals ``plain_ids``, or they first differ where plain decoding's two
    best logits were within ``near_tie`` of each other; fail otherwise."""
    first = first_difference(plain_ids, spec_ids)
    if first is None:
        return
    cache = engine.target_cache
    cache.rewind(0)
    logits = cache.forward(prompt_ids + plain_ids[:first], last_only=True)[-1]
    cache.rewind(0)
    top = np.sort(logits)[-2:]
    gap = float(top[1] - top[0])
    assert gap < near_tie, (f"greedy outputs split at token {first} where plain decoding's "
                            f"top-2 gap is {gap:.3f} (not a near-tie): {plain_ids[first:first + 5]} "
                            f"vs {spec_ids[first:first + 5]}")
