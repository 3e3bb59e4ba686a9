"""How much two token lists share from their start: what every cache lookup asks."""

from __future__ import annotations

from typing import Sequence


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    a, b = _as_list(a), _as_list(b)
    n = min(len(a), len(b))
    # Fast path: the usual case is that one list extends the other (slices of lists
    # compare at C speed; this runs a few times per round over the whole context).
    if (a if len(a) == n else a[:n]) == (b if len(b) == n else b[:n]):
        return n
    lo, hi = 0, n  # invariant: a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _as_list(tokens: Sequence[int]) -> list[int]:
    return tokens if isinstance(tokens, list) else list(tokens)
