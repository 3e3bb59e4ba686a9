"""Seed-invariant sampling: every token decided by noise keyed by (seed, position).

With the exact rule (:mod:`edgespec.core.acceptance`) a draft model's tokens are drawn
from its q and checked against p with further random numbers, so the text a
seed gives depends on the drafter, on k and on auto mode's choices. Here the
token at context position t is the winner of an exponential race (the
Gumbel-max trick): the id i with the largest ``w_i / E_i``, where w are the
weights sampling uses (p up to a factor) and ``E_i ~ Exp(1)`` is a function of
(seed, t, i) alone. So:

- the target's token at t is distributed exactly as p_t, whatever came before
  (the noise at t is fresh: no earlier token looked at it);
- a draft model drafts the race's winner under its own q, with the same noise
  (Daliri, Musco and Suresh, "drafter-invariant speculative decoding"), and a
  draft is accepted when it equals the target's winner: the committed tokens
  are the target's winners, hence the same text with any drafter, any k, or
  none (up to the rounding that makes a batched pass differ from a one-token
  pass); a deterministic drafter (prompt lookup) is verified the same way;
- acceptance is the chance that both races have one winner: below the optimal
  rule's sum of min(p, q), but close where p and q agree.

The race runs in two rounds, which is exact and cheap: blocks of 1024 ids race
first, each with its total weight against one noise (the first of a block's
ids to finish an Exp race finishes at rate equal to the block's total), then the
ids of the winning block race. A 150k vocabulary then needs 150 + 1024 noise
values a token instead of 150k. The noise comes from a counter-based hash
(splitmix64) of (seed, position, id), so numpy on the host and MLX on a device
compute the same numbers (:func:`edgespec.backends.mlx_ops.coupled_pick`).
"""

from __future__ import annotations

import functools
import secrets

import numpy as np

BLOCK = 1024  # ids per block in the first round (as edgespec.core.sampling's block sums)
_MASK = (1 << 64) - 1
_BLOCK_SALT = 0x5851F42D4C957F2D  # keys the blocks' noise apart from the ids'


def _mix(x: int) -> int:
    """splitmix64's finalizer on a Python int (mod 2**64)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def position_keys(seed: int, position: int) -> tuple[int, int]:
    """The noise keys of one position: for its ids, and for its blocks."""
    key = _mix(_mix(seed & _MASK) ^ position)
    return key, _mix(key ^ _BLOCK_SALT)


MIX = (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB)  # splitmix64's constants
UNIFORM_BITS = 23  # a uniform's resolution: (m + 0.5) / 2**23 is exact in float32 as in float64
_C0, _C1, _C2 = (np.uint64(c) for c in MIX)
_S27, _S30, _S31, _SU = (np.uint64(s) for s in (27, 30, 31, 64 - UNIFORM_BITS))


@functools.cache
def _counters(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.uint64)


def exp_noise(key: int, start: int, count: int) -> np.ndarray:
    """Exp(1) noise of ids ``start .. start + count - 1`` under ``key`` (float64)."""
    with np.errstate(over="ignore"):
        x = _counters(count) + np.uint64((key + start) & _MASK)
        x += _C0
        x = (x ^ (x >> _S30)) * _C1
        x = (x ^ (x >> _S27)) * _C2
        x ^= x >> _S31
    # The top bits, as a uniform in (0, 1): never 0, so E is finite.
    return -np.log(((x >> _SU).astype(np.float64) + 0.5) * (1.0 / (1 << UNIFORM_BITS)))


def race(weights: np.ndarray, blocks: np.ndarray, seed: int, position: int) -> int:
    """The winner of the race at ``position``: an id drawn with probability
    weights / weights.sum(), decided by (seed, position) alone.

    ``weights [V]``: non-negative, not all 0; ``blocks``: their sums over blocks of
    :data:`BLOCK` ids (:func:`edgespec.core.sampling.block_sums`)."""
    key, block_key = position_keys(seed, position)
    with np.errstate(divide="ignore"):
        block = int(np.argmax(blocks / exp_noise(block_key, 0, len(blocks))))
    start = block * BLOCK
    inner = weights[start:start + BLOCK]
    return start + int(np.argmax(inner / exp_noise(key, start, len(inner))))


class Coupling:
    """The noise of one generation: a seed (drawn at random when none is given).

    Passed where an ``np.random.Generator`` would be, it makes sampling and
    verification seed-invariant (see the module doc)."""

    def __init__(self, seed: int | None = None):
        self.seed = secrets.randbits(63) if seed is None else int(seed)

    def pick(self, weights: np.ndarray, blocks: np.ndarray, position: int) -> int:
        """The token at context ``position`` under these weights (:func:`race`)."""
        return race(weights, blocks, self.seed, position)

    def __repr__(self) -> str:
        return f"Coupling(seed={self.seed})"
