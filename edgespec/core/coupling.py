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
compute the same numbers with the same code (:func:`race_rows`).
"""

from __future__ import annotations

import functools
import secrets

import numpy as np

from .arrays import BLOCK, block_sums, namespace, uint64s, wide
_MASK = (1 << 64) - 1
_BLOCK_SALT = 0x5851F42D4C957F2D  # keys the blocks' noise apart from the ids'


MIX = (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB)  # splitmix64's constants
UNIFORM_BITS = 23  # a uniform's resolution: (m + 0.5) / 2**23 is exact in float32 as in float64


def _mix(x: int) -> int:
    """splitmix64's finalizer on a Python int (mod 2**64): :func:`noise`'s, for one key."""
    x = (x + MIX[0]) & _MASK
    x = ((x ^ (x >> 30)) * MIX[1]) & _MASK
    x = ((x ^ (x >> 27)) * MIX[2]) & _MASK
    return x ^ (x >> 31)


def position_keys(seed: int, position: int) -> tuple[int, int]:
    """The noise keys of one position: for its ids, and for its blocks."""
    key = _mix(_mix(seed & _MASK) ^ position)
    return key, _mix(key ^ _BLOCK_SALT)


@functools.cache
def _constants(xp) -> tuple:
    return tuple(uint64s(xp, MIX))


@functools.cache
def _counters(xp, count: int):
    return xp.arange(count, dtype=xp.uint64)


def noise(keys, ids):
    """Exp(1) noise of ``ids`` under ``keys`` (uint64 arrays of one namespace,
    broadcast against each other), in :func:`~edgespec.core.arrays.wide` floats."""
    xp = namespace(keys, ids)
    return _noise(xp, keys + _constants(xp)[0], ids)


def _noise(xp, salted_keys, ids):
    """:func:`noise`, with splitmix64's first step (adding ``MIX[0]``) already in the keys."""
    _, c1, c2 = _constants(xp)
    x = salted_keys + ids  # a fresh array: the rest works on it in place (on the host)
    x ^= x >> 30
    x *= c1
    x ^= x >> 27
    x *= c2
    x ^= x >> 31
    x >>= 64 - UNIFORM_BITS
    # The top bits, as a uniform in (0, 1): never 0, so E is finite.
    uniform = x.astype(wide(xp))
    uniform += 0.5
    uniform *= 1.0 / (1 << UNIFORM_BITS)
    return -xp.log(uniform)


def exp_noise(key: int, start: int, count: int) -> np.ndarray:
    """Exp(1) noise of ids ``start .. start + count - 1`` under ``key``, on the host."""
    return noise(uint64s(np, key), np.arange(start, start + count, dtype=np.uint64))


def race(weights: np.ndarray, blocks: np.ndarray, seed: int, position: int) -> int:
    """The winner of the race at ``position``: an id drawn with probability
    weights / weights.sum(), decided by (seed, position) alone.

    ``weights [V]``: non-negative, not all 0; ``blocks``: their sums over blocks of
    :data:`BLOCK` ids (:func:`edgespec.core.arrays.block_sums`)."""
    return int(race_rows(weights[None], blocks[None], seed, position)[0])


def race_rows(weights, blocks, seed: int, position: int):
    """The winner of the race in each row of ``weights [n, V]`` (row i at context
    position ``position + i``), on the host or on a device alike, with the same
    noise: a draft model on MLX and a target elsewhere are coupled. ``blocks``:
    the rows' block sums, or None to compute them."""
    xp = namespace(weights)
    rows = weights.shape[0]
    if blocks is None:
        blocks = block_sums(weights)
    salted = uint64s(xp, [[(key + MIX[0]) & _MASK for key in position_keys(seed, position + i)]
                          for i in range(rows)])  # [n, 2]: each row's keys, for its ids and blocks
    block = xp.argmax(blocks / _noise(xp, salted[:, 1:], _counters(xp, blocks.shape[-1])), axis=-1)
    first = block * BLOCK  # [n]: the first id of each row's winning block
    # The noise of ids first .. first + BLOCK - 1: their key is offset by first.
    inner_noise = _noise(xp, salted[:, :1] + first.astype(xp.uint64)[:, None], _counters(xp, BLOCK))
    return first + xp.argmax(_block_weights(xp, weights, first) / inner_noise, axis=-1)


def _block_weights(xp, weights, first):
    """The :data:`BLOCK` weights of each row of ``weights`` from id ``first[row]`` on
    (0 past the vocabulary, which cannot win: the block holds a positive weight)."""
    vocab = weights.shape[-1]
    if xp is np:  # slices: on the host a gather's indexing costs more than the race
        starts = first.tolist()
        if len(starts) == 1 and starts[0] + BLOCK <= vocab:
            return weights[:, starts[0]:starts[0] + BLOCK]
        out = np.zeros((len(starts), BLOCK), weights.dtype)
        for row, start in enumerate(starts):
            block = weights[row, start:start + BLOCK]
            out[row, :len(block)] = block
        return out
    ids = first[:, None] + xp.arange(BLOCK)
    return xp.where(ids < vocab, xp.take_along_axis(weights, xp.minimum(ids, vocab - 1), axis=-1), 0.0)


class Coupling:
    """The noise of one generation: a seed (drawn at random when none is given).

    Passed where an ``np.random.Generator`` would be, it makes sampling and
    verification seed-invariant (see the module doc)."""

    def __init__(self, seed: int | None = None):
        self.seed = secrets.randbits(63) if seed is None else int(seed)

    def pick(self, weights: np.ndarray, blocks: np.ndarray, position: int) -> int:
        """The token at context ``position`` under these weights (:func:`race`)."""
        return race(weights, blocks, self.seed, position)

    def picks(self, weights, position: int):
        """The token of each row of ``weights [n, V]``, row i at context ``position + i``
        (:func:`race_rows`: on the host or on a device)."""
        return race_rows(weights, None, self.seed, position)

    def __repr__(self) -> str:
        return f"Coupling(seed={self.seed})"
