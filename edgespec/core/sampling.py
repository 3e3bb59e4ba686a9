"""Sampling parameters and the one place where logits become probabilities.

The drafter and the target both go through :func:`logits_to_probs`, with the
same :class:`SamplingParams`. That is what the exact acceptance rule needs: p
(target) and q (drafter) must be the distributions each side really samples
from, after identical temperature / top-k / top-p / min-p processing. It is
array code for numpy and MLX alike (:mod:`edgespec.core.arrays`): the host and
MLX's device compute p with the same function, ties broken the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .arrays import BLOCK, block_sums, exp_, namespace, store, total
from .filters import filtered as _filtered



@dataclass(frozen=True)
class SamplingParams:
    """How tokens are drawn. ``temperature == 0`` means greedy decoding.

    ``top_k == 0``, ``top_p == 1``, ``min_p == 0`` and ``typical_p == 1`` switch
    those filters off (``typical_p``: locally typical sampling, llama.cpp's ``typ_p``).
    ``seed`` makes sampling reproducible; ``None`` draws a fresh seed.
    ``temperature_last``: the filters see the probabilities at temperature 1 and
    temperature applies to what they keep (llama.cpp's default sampler order);
    otherwise temperature comes first (Hugging Face's and vLLM's).
    ``invariant``: seed-invariant sampling (:mod:`edgespec.core.coupling`): each token
    is decided by noise keyed by the seed and its position, so a seed gives one
    text whatever the drafter, k or speculation on or off. ``None`` (the default):
    on when a seed is given. ``False``: the exact rule with a draft model's own
    draws, which accepts a draft model's tokens a little more often.
    """

    temperature: float = 0.8
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    invariant: bool | None = None
    typical_p: float = 1.0
    temperature_last: bool = False

    def __post_init__(self) -> None:
        for field in ("temperature", "top_p", "min_p", "typical_p"):  # "0.7" or None: say so, not TypeError
            value = getattr(self, field)
            _check(isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool),
                   field, value, "a number")
        _check(self.temperature >= 0 and np.isfinite(self.temperature),
               "temperature", self.temperature, "a finite number >= 0 (0 means greedy)")
        _check(isinstance(self.top_k, (int, np.integer)) and not isinstance(self.top_k, bool)
               and self.top_k >= 0, "top_k", self.top_k, "an integer >= 0 (0 disables it)")
        _check(0 < self.top_p <= 1, "top_p", self.top_p, "0 < top_p <= 1 (1 disables it)")
        _check(0 <= self.min_p < 1, "min_p", self.min_p, "0 <= min_p < 1 (0 disables it)")
        _check(0 < self.typical_p <= 1, "typical_p", self.typical_p, "0 < typical_p <= 1 (1 disables it)")
        _check(self.seed is None or (isinstance(self.seed, (int, np.integer)) and self.seed >= 0),
               "seed", self.seed, "a non-negative integer, or None for a random seed")
        _check(self.invariant is None or isinstance(self.invariant, (bool, np.bool_)), "invariant",
               self.invariant, "True, False or None (on when a seed is given)")
        _check(isinstance(self.temperature_last, (bool, np.bool_)), "temperature_last",
               self.temperature_last, "True or False")

    @property
    def greedy(self) -> bool:
        """True when decoding takes the argmax (temperature 0)."""
        return self.temperature == 0

    @property
    def seed_invariant(self) -> bool:
        """Whether sampling is seed-invariant (``invariant``, or else whether a seed is given)."""
        return self.seed is not None if self.invariant is None else bool(self.invariant)

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


def logits_to_probs(logits, params: SamplingParams, *, out: np.ndarray | None = None):
    """Turn logits ``[..., V]`` into the probabilities sampling really uses.

    Order: temperature, then top-k, typical-p, top-p and min-p filters, then
    renormalisation (the order of Hugging Face transformers and vLLM; llama.cpp
    puts typical-p between top-k and top-p too, but temperature last, which
    ``params.temperature_last`` asks for). At
    temperature 0 the result is one-hot on the argmax (its first index where
    several tie). Each filter keeps a row's tokens as probable as the last one
    it keeps (ties at its cut stay in, as Hugging Face's top-k keeps them).
    Float32 throughout, every row at once: the acceptance rule only
    compares p and q at the drafted token and subtracts them at a rejection,
    where float64 would change nothing that a sample can show, at twenty
    times the cost over a 150k vocabulary. ``logits``: a numpy array, or an
    MLX one (the result stays on its device; :mod:`edgespec.core.arrays`).
    ``out``: where to write the result on the host (same shape, float32),
    e.g. a row of a drafter's preallocated buffer.
    """
    weights, blocks = weights_and_blocks(logits, params, out=out)
    # One multiply by the reciprocal: the ~1e-7 relative rounding a division would also have.
    weights *= (1.0 / blocks.sum(axis=-1, keepdims=True)).astype(namespace(weights).float32)
    return weights


def weights_and_blocks(logits, params: SamplingParams, *, out: np.ndarray | None = None):
    """The probabilities of :func:`logits_to_probs` up to a factor per row
    (p = weights / total, the total being the block sums' sum), and their
    :func:`block_sums`: what sampling needs, one pass over the vocabulary
    short of normalised probabilities."""
    xp = namespace(logits)
    if xp is np:
        logits = np.asarray(logits)
        if out is None:
            out = np.empty(logits.shape, dtype=np.float32)
    vocab = logits.shape[-1]
    if params.greedy:
        hot = xp.arange(vocab) == xp.argmax(logits, axis=-1, keepdims=True)
        weights = store(hot.astype(xp.float32), out)
        return weights, block_sums(weights)
    filtered = 0 < params.top_k < vocab or params.top_p < 1.0 or params.min_p > 0.0 \
        or params.typical_p < 1.0
    if filtered and params.temperature_last and params.inverse_temperature != 1.0:
        # The filters cut at temperature 1; temperature scales what they keep.
        kept = _filtered(_exp_scaled(logits, 1.0, np.empty(logits.shape, np.float32)
                                     if xp is np else None)[0], params) > 0
        weights, _ = _exp_scaled(logits, params.inverse_temperature, out)
        weights = store(xp.where(kept, weights, 0.0), out)
        return weights, block_sums(weights)
    weights, blocks = _exp_scaled(logits, params.inverse_temperature, out)
    if filtered:
        weights = _filtered(weights, params)
        blocks = block_sums(weights)
    return weights, blocks


# exp(logit / T) unshifted is kept when every row's total lies in this range: the top
# weight is then at least 1 (no more underflow than with the shift, which puts it at
# 1) and far from float32's overflow (3.4e38, also for a block's sum of 1024 of them).
_UNSHIFTED_TOTALS = (1.0, 1e30)


def _exp_scaled(logits, inverse_temperature: float, out: np.ndarray | None):
    """exp(logits / T), up to a factor per row, and its block sums.

    Softmax's usual guard, shifting by the maximum first, costs a pass over the
    vocabulary (memory passes are what the host time per token is made of),
    so on the host rows whose weights fit float32 as they are skip it; the
    rest (very low temperatures, extreme logits) are redone with the shift.
    A device always shifts: there a pass is cheap, and a test of the totals
    would be a round trip to the host.
    """
    xp = namespace(logits)
    with np.errstate(over="ignore", invalid="ignore"):  # caught by the totals' check
        if xp is np:
            np.multiply(logits, np.float32(inverse_temperature), out=out, casting="unsafe")
            np.exp(out, out=out)
            blocks = block_sums(out)
            totals = blocks.sum(axis=-1)
            low, high = _UNSHIFTED_TOTALS
            if (low <= totals < high) if totals.ndim == 0 else np.all((totals >= low) & (totals < high)):
                return out, blocks
        # Shifted: far below the top, underflow to 0 is the right answer.
        shifted = (logits - logits.max(axis=-1, keepdims=True)).astype(xp.float32)
        weights = store(xp.exp(shifted * inverse_temperature), out)
    return weights, block_sums(weights)


def residual(p, q, *, out: np.ndarray | None = None):
    """max(0, p - q), unnormalised: what a rejected draft's replacement is drawn from
    (where it has no mass, p == q up to rounding, p is the exact answer). ``out``:
    where to write it on the host (``p`` itself may be it)."""
    if out is None:
        return namespace(p).maximum(p - q, 0.0)
    np.subtract(p, q, out=out)
    return np.maximum(out, 0.0, out=out)


class ProbRows:
    """Rows of the target's p, as the acceptance rule reads them: p(token), a
    sample, the residual after a rejection.

    Built from logits (:meth:`__init__`), each row is computed when first read
    and never normalised in full: p = weights / total, with the total from the
    block sums that sampling needs anyway. Verification stops at the first
    rejection, so the rows after it (a third of a 4-token draft's, at 70%
    acceptance) are never computed. Built from probabilities (:meth:`of_probs`),
    it reads them as they are.
    """

    def __init__(self, logits: np.ndarray | None, params: SamplingParams | None,
                 scratch: "Scratch | None" = None):
        self.logits, self.params = logits, params
        self.shape = None if logits is None else logits.shape
        self._rows: dict[int, tuple[np.ndarray, np.ndarray | None, float]] = {}  # weights, blocks, 1/total
        # Row i is written to scratch row i, a residual to the row after the last.
        self._buffer = None if scratch is None or logits is None else \
            scratch.rows(self.shape[0] + 1, self.shape[-1])

    @classmethod
    def of_probs(cls, probs: np.ndarray) -> "ProbRows":
        """Rows of probabilities ``[n, V]`` computed elsewhere (each summing to 1)."""
        rows = cls(None, None)
        rows.shape = probs.shape
        rows._rows = {i: (row, None, 1.0) for i, row in enumerate(probs)}
        return rows

    def _row(self, index: int) -> tuple[np.ndarray, np.ndarray | None, float]:
        rows = self.shape[0]
        if not -rows <= index < rows:
            raise IndexError(f"row {index} of {rows}")
        index = int(index) % rows
        if index not in self._rows:
            out = None if self._buffer is None else self._buffer[index]
            weights, blocks = weights_and_blocks(self.logits[index], self.params, out=out)
            self._rows[index] = weights, blocks, 1.0 / float(blocks.sum())
        return self._rows[index]

    def prob(self, index: int, token: int) -> float:
        """p of ``token`` in row ``index``."""
        weights, _, scale = self._row(index)
        return float(weights[token]) * scale

    def sample(self, index: int, rng: np.random.Generator) -> int:
        """A token drawn from row ``index``."""
        weights, blocks, _ = self._row(index)
        return sample_from(weights, rng, blocks)

    def pick(self, index: int, coupling, position: int) -> int:
        """The token the :class:`~edgespec.core.coupling.Coupling` decides for row ``index``,
        at context ``position``."""
        weights, blocks, _ = self._row(index)
        return coupling.pick(weights, block_sums(weights) if blocks is None else blocks, position)

    def sample_residual(self, index: int, q: np.ndarray, rng: np.random.Generator,
                        q_scale: float = 1.0) -> int:
        """A token from norm(max(0, p - q)) of row ``index`` (q = ``q * q_scale``);
        from p when that leaves no mass, which only rounding reaches (p == q: p is
        then exact)."""
        weights, _, scale = self._row(index)
        # In a buffer of its own: q belongs to the drafter, the weights may be read again.
        out = None if self._buffer is None else self._buffer[-1]
        # max(0, p - q) / q_scale: the same draw, with no pass to scale q.
        scaled = np.multiply(weights, np.float32(scale / q_scale), out=out)
        remaining = residual(scaled, q, out=scaled)
        blocks = block_sums(remaining)
        return sample_from(remaining, rng, blocks) if blocks.sum() > 0 else self.sample(index, rng)

    def __getitem__(self, index: int) -> np.ndarray:
        weights, _, scale = self._row(index)
        return weights * np.float32(scale)

    def top(self, count: int) -> np.ndarray:
        """The largest probability of each of the first ``count`` rows."""
        return np.array([weights.max() * scale for weights, _, scale in map(self._row, range(count))],
                        dtype=np.float32)


class Scratch:
    """Float32 rows kept from one round to the next, for sampling's work over the
    vocabulary.

    A row over a 150k vocabulary is 600 KB: glibc maps a fresh block of that size
    from the system and unmaps it when freed, so a buffer allocated per row
    page-faults on first touch, costing about as much as the exp it holds
    (``scripts/bench_overhead.py``: 0.08 ms per row). One owner at a time: what
    :meth:`rows` returned is overwritten by its next call.
    """

    def __init__(self):
        self._buffer = np.empty((0, 0), np.float32)

    def rows(self, count: int, width: int) -> np.ndarray:
        """``[count, width]`` float32 rows (uninitialised)."""
        if self._buffer.shape[0] < count or self._buffer.shape[1] != width:
            self._buffer = np.empty((max(count, self._buffer.shape[0]), width), np.float32)
        return self._buffer[:count]


def top_probability(logits, scratch: Scratch | None = None):
    """The largest softmax probability of each row of ``logits [n, V]`` (at
    temperature 0, the confidence a draft model's stop threshold is tested on;
    on a device, where the logits are). ``scratch``: where to compute on the host
    (auto mode asks this of every plain step: a fresh array over the vocabulary
    each time cost more than the arithmetic)."""
    xp = namespace(logits)
    if xp is np and scratch is not None and logits.ndim == 2:
        shifted = np.subtract(logits, logits.max(-1, keepdims=True), out=scratch.rows(*logits.shape))
    else:
        shifted = logits - logits.max(-1, keepdims=True)
    return 1.0 / exp_(shifted).sum(-1)  # in place on the host: one temporary, not two


def sample_from(probs: np.ndarray, rng: np.random.Generator,
                blocks: np.ndarray | None = None) -> int:
    """Draw one token id from a (possibly unnormalised) non-negative vector.

    Two levels: pick a block of ids with probability its mass, then an id
    within it; P(id) = probs[id] / sum(probs), as with one cumulative sum.
    ``blocks``: :func:`block_sums` of ``probs``, when the caller has them.
    """
    probs = np.asarray(probs)
    if blocks is None:
        blocks = block_sums(probs)
    cumulative = blocks.cumsum()
    total = float(cumulative[-1])
    if not total > 0:
        raise ValueError("cannot sample from an all-zero distribution")
    u = rng.random() * total
    # The first block whose cumulative mass exceeds u has mass > 0.
    block = min(int(cumulative.searchsorted(u, side="right")), len(blocks) - 1)
    while blocks[block] <= 0:  # only rounding at the very top lands here
        block -= 1
    start = block * BLOCK
    inner = probs[start:start + BLOCK].cumsum(dtype=np.float64)
    u = min(u - (float(cumulative[block - 1]) if block else 0.0), float(inner[-1]))
    index = int(inner.searchsorted(u, side="right"))
    # Rounding may put u at the block's total: take its last id that has mass.
    if index >= len(inner) or probs[start + index] <= 0:
        index = int(np.flatnonzero(probs[start:start + BLOCK])[-1])
    return start + index


def make_rng(params: SamplingParams):
    """The random state of one generation under ``params``: a numpy generator, or
    when seed-invariant the :class:`~edgespec.core.coupling.Coupling` of its seed."""
    if params.seed_invariant:
        from .coupling import Coupling
        return Coupling(params.seed)
    return np.random.default_rng(params.seed)
