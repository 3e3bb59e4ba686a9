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
        for field in ("temperature", "top_p", "min_p"):  # "0.7" or None: say so, not TypeError
            value = getattr(self, field)
            _check(isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool),
                   field, value, "a number")
        _check(self.temperature >= 0 and np.isfinite(self.temperature),
               "temperature", self.temperature, "a finite number >= 0 (0 means greedy)")
        _check(isinstance(self.top_k, (int, np.integer)) and not isinstance(self.top_k, bool)
               and self.top_k >= 0, "top_k", self.top_k, "an integer >= 0 (0 disables it)")
        _check(0 < self.top_p <= 1, "top_p", self.top_p, "0 < top_p <= 1 (1 disables it)")
        _check(0 <= self.min_p < 1, "min_p", self.min_p, "0 <= min_p < 1 (0 disables it)")
        _check(self.seed is None or (isinstance(self.seed, (int, np.integer)) and self.seed >= 0),
               "seed", self.seed, "a non-negative integer, or None for a random seed")

    @property
    def greedy(self) -> bool:
        """True when decoding takes the argmax (temperature 0)."""
        return self.temperature == 0

    @property
    def inverse_temperature(self) -> float:
        """1 / temperature, capped to a finite float32: below T ~ 3e-39 it would be inf,
        and inf · 0 at the top logit NaN; capped, a vanishing T is greedy (ties shared)."""
        return min(1.0 / self.temperature, float(np.finfo(np.float32).max))

    def with_(self, **changes) -> "SamplingParams":
        """A copy with some fields changed (validated like the original)."""
        return replace(self, **changes)


def _check(ok: bool, field: str, value, allowed: str) -> None:
    if not ok:
        raise ValueError(f"invalid {field}={value!r}: must be {allowed}")


def logits_to_probs(logits: np.ndarray, params: SamplingParams, *,
                    out: np.ndarray | None = None) -> np.ndarray:
    """Turn logits ``[..., V]`` into the probabilities sampling really uses.

    Order: temperature, then top-k, top-p and min-p filters, then
    renormalisation (the order of Hugging Face transformers and vLLM). At
    temperature 0 the result is one-hot on the argmax. Float32 throughout,
    every row at once: the acceptance rule only
    compares p and q at the drafted token and subtracts them at a rejection,
    where float64 would change nothing that a sample can show, at twenty
    times the cost over a 150k vocabulary. ``out``: where to write the result
    (same shape, float32), e.g. a row of a drafter's preallocated buffer.
    """
    logits = np.asarray(logits)
    if out is None:
        out = np.empty(logits.shape, dtype=np.float32)
    if params.greedy:
        out.fill(0.0)
        np.put_along_axis(out, np.argmax(logits, axis=-1)[..., None], 1.0, axis=-1)
        return out
    np.subtract(logits, logits.max(axis=-1, keepdims=True), out=out, casting="unsafe")
    with np.errstate(over="ignore"):  # far below the top, -inf is the right answer
        out *= np.float32(params.inverse_temperature)
    np.exp(out, out=out)
    vocab = out.shape[-1]
    if 0 < params.top_k < vocab:
        # Keep the top_k most probable (ties at the boundary resolved by argpartition).
        drop = np.argpartition(out, vocab - params.top_k, axis=-1)[..., : vocab - params.top_k]
        np.put_along_axis(out, drop, 0.0, axis=-1)
    if params.top_p < 1.0:
        for row in out.reshape(-1, vocab):
            _top_p(row, params.top_p)
    if params.min_p > 0.0:
        out[out < params.min_p * out.max(axis=-1, keepdims=True)] = 0.0
    out /= out.sum(axis=-1, keepdims=True)  # numpy sums float32 pairwise: ~1e-7 relative
    return out


class ProbRows:
    """The rows of ``logits_to_probs(logits, params)``, each computed when first read.

    Verification reads p row by row and stops at the first rejection, so the
    rows after it (a third of a 4-token draft's, at 70% acceptance) are never
    computed. Indexes like the ``[n, V]`` array it stands for.
    """

    def __init__(self, logits: np.ndarray, params: SamplingParams):
        self.logits, self.params = logits, params
        self.shape = logits.shape
        self._rows: dict[int, np.ndarray] = {}

    def __getitem__(self, index: int) -> np.ndarray:
        rows = self.shape[0]
        if not -rows <= index < rows:
            raise IndexError(f"row {index} of {rows}")
        index = int(index) % rows
        if index not in self._rows:
            self._rows[index] = logits_to_probs(self.logits[index], self.params)
        return self._rows[index]

    def top(self, count: int) -> np.ndarray:
        """The largest probability of each of the first ``count`` rows."""
        return np.array([self[i].max() for i in range(count)], dtype=np.float32)


def top_probability(logits: np.ndarray) -> np.ndarray:
    """The largest softmax probability of each row of ``logits [..., V]`` (at
    temperature 0, the confidence a draft model's stop threshold is tested on)."""
    shifted = logits - logits.max(-1, keepdims=True)
    np.exp(shifted, out=shifted)  # in place: one temporary over the vocabulary, not two
    return 1.0 / shifted.sum(-1)


def _top_p(probs: np.ndarray, top_p: float) -> None:
    """Zero, in place, all tokens outside the smallest set whose mass reaches ``top_p``."""
    total = probs.sum(dtype=np.float64)
    vocab = probs.shape[-1]
    candidates = None
    if vocab > _TOP_P_CANDIDATES:
        candidates = np.argpartition(probs, vocab - _TOP_P_CANDIDATES)[-_TOP_P_CANDIDATES:]
        if probs[candidates].sum(dtype=np.float64) < top_p * total:
            candidates = None
    if candidates is None:
        candidates = np.arange(vocab)
    order = candidates[np.argsort(-probs[candidates], kind="stable")]
    cumulative = np.cumsum(probs[order], dtype=np.float64)
    # Keep tokens up to and including the one that crosses top_p.
    keep = int(np.searchsorted(cumulative, top_p * total, side="left")) + 1
    kept = order[:keep]
    values = probs[kept]
    probs.fill(0.0)
    probs[kept] = values


# Sampling sums the vocabulary in blocks of this many ids, then searches one block:
# one pass over the vocabulary instead of a cumulative sum over all of it.
_BLOCK = 1024


def sample_from(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token id from a (possibly unnormalised) non-negative vector.

    Two levels: pick a block of ids with probability its mass, then an id
    within it; P(id) = probs[id] / sum(probs), as with one cumulative sum.
    """
    probs = np.asarray(probs)
    vocab = probs.shape[-1]
    whole = vocab // _BLOCK * _BLOCK
    block_sums = np.empty(-(-vocab // _BLOCK), dtype=np.float64)
    block_sums[:whole // _BLOCK] = probs[:whole].reshape(-1, _BLOCK).sum(axis=1)
    if whole < vocab:
        block_sums[-1] = probs[whole:].sum()
    cumulative = np.cumsum(block_sums)
    total = cumulative[-1]
    if not total > 0:
        raise ValueError("cannot sample from an all-zero distribution")
    u = rng.random() * total
    # The first block whose cumulative mass exceeds u has mass > 0.
    block = min(int(np.searchsorted(cumulative, u, side="right")), len(block_sums) - 1)
    while block_sums[block] <= 0:  # only rounding at the very top lands here
        block -= 1
    start = block * _BLOCK
    inner = np.cumsum(probs[start:start + _BLOCK], dtype=np.float64)
    u = min(u - (cumulative[block - 1] if block else 0.0), inner[-1])
    index = int(np.searchsorted(inner, u, side="right"))
    # Rounding may put u at the block's total: take its last id that has mass.
    if index >= len(inner) or probs[start + index] <= 0:
        index = int(np.flatnonzero(probs[start:start + _BLOCK])[-1])
    return start + index


def make_rng(params: SamplingParams) -> np.random.Generator:
    """The random generator for one generation under ``params``."""
    return np.random.default_rng(params.seed)
