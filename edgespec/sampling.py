"""Sampling parameters and the one place where logits become probabilities.

The drafter and the target both go through :func:`logits_to_probs`, with the
same :class:`SamplingParams`. That is what the exact acceptance rule needs: p
(target) and q (drafter) must be the distributions each side really samples
from, after identical temperature / top-k / top-p / min-p processing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

# top-p needs the tokens sorted by probability. Sorting a 150k vocabulary
# costs ~10 ms, a third of a target step on a laptop CPU, so we first sort only
# the largest few hundred and fall back to a full sort when they do not carry
# top_p of the mass (rare with real models).
_TOP_P_CANDIDATES = 512


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are drawn. ``temperature == 0`` means greedy decoding.

    ``top_k == 0``, ``top_p == 1`` and ``min_p == 0`` switch those filters off.
    ``seed`` makes sampling reproducible; ``None`` draws a fresh seed.
    """

    temperature: float = 0.8
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        _check(self.temperature >= 0 and np.isfinite(self.temperature),
               "temperature", self.temperature, "a finite number >= 0 (0 means greedy)")
        _check(isinstance(self.top_k, (int, np.integer)) and self.top_k >= 0,
               "top_k", self.top_k, "an integer >= 0 (0 disables it)")
        _check(0 < self.top_p <= 1, "top_p", self.top_p, "0 < top_p <= 1 (1 disables it)")
        _check(0 <= self.min_p < 1, "min_p", self.min_p, "0 <= min_p < 1 (0 disables it)")
        _check(self.seed is None or (isinstance(self.seed, (int, np.integer)) and self.seed >= 0),
               "seed", self.seed, "a non-negative integer, or None for a random seed")

    @property
    def greedy(self) -> bool:
        """True when decoding takes the argmax (temperature 0)."""
        return self.temperature == 0

    def with_(self, **changes) -> "SamplingParams":
        """A copy with some fields changed (validated like the original)."""
        return replace(self, **changes)


def _check(ok: bool, field: str, value, allowed: str) -> None:
    if not ok:
        raise ValueError(f"invalid {field}={value!r}: must be {allowed}")


def logits_to_probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Turn logits ``[..., V]`` into the probabilities sampling really uses.

    Order: temperature, then top-k, top-p and min-p filters, then
    renormalisation (the order of Hugging Face transformers and vLLM). At
    temperature 0 the result is one-hot on the argmax. Returns float64 so that
    ratios p/q and residuals in the verifier are not dominated by rounding.
    """
    logits = np.asarray(logits)
    if logits.ndim > 1:
        return np.stack([logits_to_probs(row, params) for row in logits])
    if params.greedy:
        probs = np.zeros(logits.shape[-1], dtype=np.float64)
        probs[int(np.argmax(logits))] = 1.0
        return probs

    scaled = logits.astype(np.float64) / params.temperature
    scaled -= scaled.max()
    probs = np.exp(scaled)
    probs /= probs.sum()

    vocab = probs.shape[-1]
    if 0 < params.top_k < vocab:
        # Keep the top_k most probable (ties at the boundary resolved by argpartition).
        drop = np.argpartition(probs, vocab - params.top_k)[: vocab - params.top_k]
        probs[drop] = 0.0
    if params.top_p < 1.0:
        probs = _top_p(probs, params.top_p)
    if params.min_p > 0.0:
        probs[probs < params.min_p * probs.max()] = 0.0
    return probs / probs.sum()


def top_probability(logits: np.ndarray) -> np.ndarray:
    """The largest softmax probability of each row of ``logits [..., V]`` (at
    temperature 0, the confidence a draft model's stop threshold is tested on)."""
    return 1.0 / np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)


def _top_p(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Zero all tokens outside the smallest set whose mass reaches ``top_p``."""
    total = probs.sum()
    vocab = probs.shape[-1]
    candidates = None
    if vocab > _TOP_P_CANDIDATES:
        candidates = np.argpartition(probs, vocab - _TOP_P_CANDIDATES)[-_TOP_P_CANDIDATES:]
        if probs[candidates].sum() < top_p * total:
            candidates = None
    if candidates is None:
        candidates = np.arange(vocab)
    order = candidates[np.argsort(-probs[candidates], kind="stable")]
    cumulative = np.cumsum(probs[order])
    # Keep tokens up to and including the one that crosses top_p.
    keep = int(np.searchsorted(cumulative, top_p * total, side="left")) + 1
    filtered = np.zeros_like(probs)
    kept = order[:keep]
    filtered[kept] = probs[kept]
    return filtered


def sample_from(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token id from a (possibly unnormalised) non-negative vector."""
    cumulative = np.cumsum(probs)
    total = cumulative[-1]
    if not total > 0:
        raise ValueError("cannot sample from an all-zero distribution")
    index = int(np.searchsorted(cumulative, rng.random() * total, side="right"))
    # Guard against rounding at the top end landing past the last token.
    return min(index, probs.shape[-1] - 1)


def make_rng(params: SamplingParams) -> np.random.Generator:
    """The random generator for one generation under ``params``."""
    return np.random.default_rng(params.seed)
