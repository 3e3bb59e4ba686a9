"""Sampling and verification where MLX's logits live: on the device.

The math is core's, written once as array code for numpy and MLX alike
(:mod:`edgespec.core.arrays`): :func:`~edgespec.core.sampling.logits_to_probs`,
the race of :mod:`edgespec.core.coupling`, and the acceptance rule's tokens for
every row at once (:func:`edgespec.core.acceptance.own_tokens`). On Metal a
round trip to the host costs more than the arithmetic, so a round builds one
lazy graph and evaluates it once: the draft model's k steps (each sampled
token feeding the next forward as an ``mx.array``), and, separately, the
verification of the target's rows. Only token ids and a few scalars cross to
the host (counted in :data:`host_syncs`, so a test can hold the engine to two
per round). What is MLX's own is here: that synchronization, and the device's
random draws (keys drawn from the generation's numpy generator, so a seed
fixes them).
"""

from __future__ import annotations

from typing import Sequence

import mlx.core as mx
import numpy as np

from ..core.acceptance import Verdict, keep_while_equal, own_tokens
from ..core.sampling import SamplingParams

host_syncs = 0  # evaluations that brought results to the host, since import


def to_host(*arrays: mx.array, also: Sequence[mx.array] = ()) -> list[np.ndarray]:
    """Evaluate ``arrays`` (and ``also``, which stay on the device) together, and bring
    ``arrays`` to the host: one synchronization."""
    global host_syncs
    mx.eval(*arrays, *also)
    host_syncs += 1
    return [np.array(a) for a in arrays]


def key_from(rng: np.random.Generator) -> mx.array:
    """An MLX random key drawn from the generation's numpy generator (so a seed
    fixes device sampling too)."""
    return mx.random.key(int(rng.integers(0, 2**64, dtype=np.uint64)))


def sample(p: mx.array, key: mx.array) -> mx.array:
    """One token id per row of probabilities ``p`` (or weights: unnormalised):
    Gumbel-max over log p, as ``mx.random.categorical``, but with the noise kept
    finite, so that an id without probability never wins (a uniform draw of
    exactly 0 makes a Gumbel of -inf)."""
    noisy = mx.maximum(mx.log(p) + mx.random.gumbel(shape=p.shape, key=key), _LOWEST)
    return mx.argmax(mx.where(p > 0, noisy, -mx.inf), axis=-1)


_LOWEST = float(np.finfo(np.float32).min)


class DeviceDraws:
    """The random draws of one verification on the device
    (:class:`edgespec.core.acceptance.Draws`), from the generation's numpy generator.

    A deterministic drafter's round (or a plain step) samples row i with the key a
    plain step at its position would get, and :meth:`settle` then leaves ``rng``
    where plain sampling would leave it: with one seed the tokens are plain
    sampling's. A draft model's round takes one key, split between its uniforms
    and its draws."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self._state = None  # the generator's state before a deterministic drafter's keys
        self._keys = None

    def each(self, probs: mx.array) -> mx.array:
        """A token from each row of ``probs``, as plain steps would draw them."""
        self._state = self.rng.bit_generator.state
        keys = [mx.random.split(key_from(self.rng))[1] for _ in range(len(probs))]
        return mx.concatenate([sample(probs[i:i + 1], key) for i, key in enumerate(keys)])

    def uniform(self, count: int) -> mx.array:
        """``count`` uniforms in [0, 1)."""
        return mx.random.uniform(shape=(count,), key=self._round_keys()[0])

    def draw(self, weights: mx.array) -> mx.array:
        """A token from each row of ``weights``."""
        return sample(weights, self._round_keys()[1])

    def _round_keys(self) -> mx.array:
        if self._keys is None:
            self._keys = mx.random.split(key_from(self.rng))
        return self._keys

    def settle(self, verdict: Verdict) -> None:
        """After a deterministic drafter's round: one key used per committed token, as
        plain steps draw them."""
        if self._state is not None:
            self.rng.bit_generator.state = self._state
            for _ in range(len(verdict.token_ids)):
                key_from(self.rng)


def verify_on_device(logits: mx.array, draft_token_ids: Sequence[int], draft_probs,
                     params: SamplingParams, rng, *, draft_scales=None,
                     position: int = 0) -> tuple[Verdict, np.ndarray]:
    """The verdict on a round from the target's rows of logits ``[n, V]`` on the
    device, and the target's top probability at each committed token; one sync.

    ``draft_probs``: q ``[k, V']`` (an MLX or numpy array), or None for a
    deterministic drafter (q one-hot on each draft). ``rng``: a numpy generator,
    or a :class:`~edgespec.core.coupling.Coupling` (row 0 at context ``position``).
    The rows' own tokens are :func:`edgespec.core.acceptance.own_tokens`.
    """
    draws = DeviceDraws(rng)
    own, top = to_host(*own_tokens(logits, draft_token_ids, draft_probs, params, rng, draws,
                                   draft_scales=draft_scales, position=position))
    verdict = keep_while_equal(own, draft_token_ids)
    draws.settle(verdict)
    return verdict, top[:verdict.num_accepted + 1]
