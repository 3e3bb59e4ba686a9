"""The filters sampling applies to a row's weights (exp(logit / T), up to a factor):
top-k, typical-p, top-p and min-p, each keeping the tokens as probable as the last
one it keeps. Array code for numpy and MLX alike (:mod:`edgespec.core.arrays`)."""

from __future__ import annotations

import numpy as np

from .arrays import namespace, total, wide, zero_below

_TOP_P_CANDIDATES = 512  # the largest weights the host sorts first for top-p


def filtered(weights, params):
    """``weights`` through top-k, typical-p, top-p and min-p, in that order (in place on
    the host; ``params``: a :class:`~edgespec.core.sampling.SamplingParams`)."""
    xp, vocab = namespace(weights), weights.shape[-1]
    if 0 < params.top_k < vocab:  # the k-th largest weight: kept, and all as large
        weights = zero_below(weights, xp.partition(weights, vocab - params.top_k, axis=-1)
                             [..., vocab - params.top_k, None])
    if params.typical_p < 1.0:
        weights = _typical(weights, params.typical_p)
    if params.top_p < 1.0:
        weights = zero_below(weights, _top_p_threshold(weights, params.top_p))
    if params.min_p > 0.0:
        weights = zero_below(weights, params.min_p * weights.max(axis=-1, keepdims=True))
    return weights


def _typical(weights, typical_p: float):
    """Locally typical sampling (llama.cpp's ``llama_sampler_typical``): the tokens in
    order of how far their surprise -log p lies from the row's entropy, up to and
    including the one whose cumulative mass first exceeds ``typical_p`` (with the
    tokens as far as it)."""
    xp = namespace(weights)
    p = (weights / total(weights)).astype(wide(xp))
    present = p > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        logp = xp.where(present, xp.log(xp.where(present, p, 1.0)), 0.0)
        entropy = -(p * logp).sum(axis=-1, keepdims=True)
        distance = xp.where(present, xp.abs(-logp - entropy), float("inf"))
    order = xp.argsort(distance, axis=-1)
    cumulative = xp.cumsum(xp.take_along_axis(p, order, axis=-1), axis=-1)
    crossing = (cumulative[..., :-1] <= typical_p).sum(axis=-1, keepdims=True)
    cut = xp.take_along_axis(xp.take_along_axis(distance, order, axis=-1), crossing, axis=-1)
    if xp is np:  # (in place, as the other filters)
        weights[distance > cut] = 0.0
        return weights
    return xp.where(distance <= cut, weights, 0.0)


def _top_p_threshold(weights, top_p: float):
    """The least weight top-p keeps in each row ``[..., 1]``: the smallest set of the
    most probable tokens whose mass reaches ``top_p``, up to and including the one
    that crosses it (with the tokens tied with that one).

    top-p needs the tokens sorted by probability. Sorting a 150k vocabulary costs
    ~10 ms on the host, a third of a target step on a laptop CPU, so the host
    first sorts only the largest few hundred and sorts them all only where
    those do not carry top_p of the mass (rare with real models).
    """
    xp = namespace(weights)
    vocab = weights.shape[-1]
    target = top_p * total(weights)
    if xp is np and vocab > _TOP_P_CANDIDATES:
        largest = np.partition(weights, vocab - _TOP_P_CANDIDATES, axis=-1)[..., vocab - _TOP_P_CANDIDATES:]
        threshold, reached = _crossing(largest, target)
        if np.all(reached):
            return threshold
    return _crossing(weights, target)[0]


def _crossing(weights, target):
    """The weight of the token whose cumulative mass, in order of weight, first reaches
    ``target``, and whether the weights' mass reaches it at all (each per row)."""
    xp = namespace(weights)
    ordered = -xp.sort(-weights, axis=-1)
    cumulative = xp.cumsum(ordered.astype(wide(xp)), axis=-1)
    # Kept: the tokens before the crossing one (their mass is short of target), and it.
    kept = (cumulative[..., :-1] < target).sum(axis=-1, keepdims=True)
    return xp.take_along_axis(ordered, kept, axis=-1), cumulative[..., -1:] >= target
