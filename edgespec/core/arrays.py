"""The math runs on numpy (the host) and on MLX (a device), written once.

The functions of :mod:`.sampling`, :mod:`.coupling` and :mod:`.acceptance` that take
arrays work in the namespace of the arrays they are given (:func:`namespace`, as
the Python array API standard has it): numpy where the logits came to the host,
``mlx.core`` where MLX keeps them on its device, so that there only token ids
cross to the host. Core never imports MLX: an MLX array comes from a module that
already did.

Why one code and not numpy that MLX calls: on Metal a round trip to the host
for every row costs more than the arithmetic, and the logits of a verify pass
are ``k + 1`` rows over a vocabulary of up to 150k ids. The two namespaces share
the operations used here (where, maximum, exp, log, argmax, sort, partition,
cumsum, take_along_axis, pad, concatenate, arange, astype); what differs is
spelled once below: writing in place (numpy only; on the host a fresh array
over the vocabulary page-faults, which costs as much as the exp it holds), and
the widest float (Metal has no float64).
"""

from __future__ import annotations

import sys

import functools

import numpy as np

# Sampling sums the vocabulary in blocks of this many ids, then searches one block
# (one pass over the vocabulary instead of a cumulative sum over all of it); the
# race of edgespec.core.coupling runs between blocks, then within one.
BLOCK = 1024


def namespace(*arrays):
    """numpy, or ``mlx.core`` when any of ``arrays`` is an MLX array."""
    for array in arrays:
        if type(array).__module__ == "mlx.core":
            return sys.modules["mlx.core"]
    return np


def wide(xp):
    """The float sums and noise are kept in: float64 on the host, float32 on a device."""
    return np.float64 if xp is np else xp.float32


def uint64s(xp, values) -> object:
    """``values`` (Python ints below 2**64) as a uint64 array of namespace ``xp``."""
    values = np.asarray(values, dtype=np.uint64)
    return values if xp is np else xp.array(values)


def total(values):
    """Sums over the last axis (kept), in :func:`wide` floats."""
    if namespace(values) is np:
        return values.sum(axis=-1, keepdims=True, dtype=np.float64)
    return values.sum(axis=-1, keepdims=True)


def zero_below(weights, threshold):
    """``weights`` where they reach ``threshold`` (broadcast), else 0: a filter's cut
    (a row's ties with its threshold are kept). In place on the host."""
    if namespace(weights) is np:
        weights[weights < threshold] = 0.0
        return weights
    return namespace(weights).where(weights >= threshold, weights, 0.0)


def exp_(values):
    """exp of ``values``, in place on the host."""
    xp = namespace(values)
    return np.exp(values, out=values) if xp is np else xp.exp(values)


def store(values, out=None):
    """``values``, written into ``out`` when given (a host buffer)."""
    if out is None:
        return values
    out[...] = values
    return out


@functools.cache
def _ones(xp, dtype):
    return xp.ones(BLOCK, dtype=dtype)


def block_sums(values):
    """Sums of ``values [..., V]`` over consecutive blocks of ids (``[..., blocks]``;
    float64 on the host)."""
    xp = namespace(values)
    lead, vocab = values.shape[:-1], values.shape[-1]
    whole = vocab - vocab % BLOCK
    # A product with a vector of ones: one vectorised pass, a third of the time
    # numpy's pairwise sum takes over the same blocks (rounding alike at 1e-7).
    sums = values[..., :whole].reshape(*lead, whole // BLOCK, BLOCK) @ _ones(xp, values.dtype)
    if whole < vocab:
        sums = xp.concatenate([sums, values[..., whole:].sum(axis=-1, keepdims=True)], axis=-1)
    return sums.astype(wide(xp))
