"""Sampling and verification where MLX's logits live: on the device.

The numpy path (:mod:`edgespec.core.sampling`, :mod:`edgespec.core.acceptance`) brings every
row of logits to the host. On Metal that round trip, one per drafted token,
costs more than the arithmetic; here a round builds one lazy graph and
evaluates it once: the draft model's k steps (each sampled token feeding the
next forward as an ``mx.array``), and, separately, the verification of the
target's rows. Only token ids and a few scalars cross to the host (counted in
:data:`host_syncs`, so a test can hold the engine to two per round).

The acceptance rule is the one in :mod:`edgespec.core.acceptance`, evaluated for every
draft position at once: position i is accepted when ``u_i · q_i(x_i) <
p_i(x_i)``, a replacement is drawn from every row's residual ``max(p_i - q_i,
0)`` (from ``p_k`` after the last), and the host keeps the accepted prefix and
the replacement at the first rejection. Draws beyond it are independent and
unused, so the verdict is distributed exactly as the sequential rule's. For a
deterministic drafter (q one-hot) every row is sampled as a plain step would
sample it, and drafts are kept while they equal those samples.
"""

from __future__ import annotations

from typing import Sequence

import mlx.core as mx
import numpy as np

from ..core.coupling import BLOCK, MIX, UNIFORM_BITS, Coupling, position_keys
from ..core.sampling import SamplingParams
from ..core.acceptance import Verdict, greedy_verify

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


def probs(logits: mx.array, params: SamplingParams) -> mx.array:
    """:func:`edgespec.core.sampling.logits_to_probs` in MLX operations, over the last axis.

    The filters keep every token tied with the last one kept (the numpy path
    breaks exact ties by index); otherwise the same order and the same rule.
    """
    vocab = logits.shape[-1]
    if params.greedy:
        return (mx.arange(vocab) == mx.argmax(logits, axis=-1, keepdims=True)).astype(mx.float32)
    x = logits.astype(mx.float32)
    p = mx.exp((x - x.max(axis=-1, keepdims=True)) * params.inverse_temperature)
    if 0 < params.top_k < vocab:
        kth = mx.sort(p, axis=-1)[..., vocab - params.top_k][..., None]
        p = mx.where(p >= kth, p, 0.0)
    if params.top_p < 1.0:
        ordered = -mx.sort(-p, axis=-1)
        before = mx.cumsum(ordered, axis=-1) - ordered  # mass of the tokens ahead of each
        inside = before < params.top_p * ordered.sum(axis=-1, keepdims=True)
        smallest = mx.where(inside, ordered, mx.inf).min(axis=-1, keepdims=True)
        p = mx.where(p >= smallest, p, 0.0)
    if params.min_p > 0.0:
        p = mx.where(p >= params.min_p * p.max(axis=-1, keepdims=True), p, 0.0)
    return p / p.sum(axis=-1, keepdims=True)


def sample(p: mx.array, key: mx.array) -> mx.array:
    """One token id per row of probabilities ``p``: Gumbel-max over log p, as
    ``mx.random.categorical``, but with the noise kept finite, so that an id without
    probability never wins (a uniform draw of exactly 0 makes a Gumbel of -inf)."""
    noisy = mx.maximum(mx.log(p) + mx.random.gumbel(shape=p.shape, key=key), _LOWEST)
    return mx.argmax(mx.where(p > 0, noisy, -mx.inf), axis=-1)


_LOWEST = float(np.finfo(np.float32).min)


def fit_vocab(q: mx.array, vocab_size: int) -> mx.array:
    """q over the target's vocabulary (as :func:`edgespec.core.acceptance._fit_vocab`)."""
    width = q.shape[-1]
    if width > vocab_size:
        return q[:, :vocab_size]
    if width < vocab_size:
        return mx.pad(q, [(0, 0), (0, vocab_size - width)])
    return q


def verify_on_device(logits: mx.array, draft_token_ids: Sequence[int], draft_probs,
                     params: SamplingParams, rng, *, position: int = 0) -> tuple[Verdict, np.ndarray]:
    """The verdict on a round from the target's rows of logits ``[k+1, V]`` on the
    device, and the target's top probability at each committed token; one sync.

    ``draft_probs``: q ``[k, V']`` (an MLX or numpy array), or None for a
    deterministic drafter (q one-hot on each draft). ``rng``: a numpy generator,
    or a :class:`~edgespec.core.coupling.Coupling` (row 0 at context ``position``).
    """
    num_draft = len(draft_token_ids)
    if logits.shape[0] != num_draft + 1:
        raise ValueError(f"target rows: got {logits.shape[0]} for {num_draft} drafts; "
                         f"need k+1 = {num_draft + 1}")
    vocab = logits.shape[-1]
    if params.greedy:
        argmax, top = to_host(mx.argmax(logits, axis=-1), top_probability(logits))
        verdict = greedy_verify(argmax, draft_token_ids)
        return verdict, top[:verdict.num_accepted + 1]
    p = probs(logits, params)  # [k+1, V]
    if isinstance(rng, Coupling):  # every row's own token by the noise; drafts kept while equal
        own, top = to_host(coupled_pick(p, rng, position), p.max(axis=-1))
        verdict = greedy_verify(own, draft_token_ids)
        return verdict, top[:verdict.num_accepted + 1]
    if draft_probs is None or not num_draft:  # a deterministic drafter's round, or a plain step
        return _verify_own_samples(p, draft_token_ids, rng)
    key_u, key_x = mx.random.split(key_from(rng))
    ids = mx.array(list(draft_token_ids), dtype=mx.int32)[:, None]
    p_x = mx.take_along_axis(p[:num_draft], ids, axis=1)[:, 0]
    q = fit_vocab(mx.array(draft_probs), vocab)
    q_x = mx.take_along_axis(q, ids, axis=1)[:, 0]
    residual = mx.maximum(p[:num_draft] - q, 0.0)
    # Where p == q the residual is empty (up to rounding); p is then the exact answer.
    residual = mx.where(residual.sum(axis=-1, keepdims=True) > 0, residual, p[:num_draft])
    accept = mx.random.uniform(shape=(num_draft,), key=key_u) * q_x < p_x
    rows = mx.concatenate([residual, p[num_draft:]], axis=0)
    accept, tokens, top = to_host(accept, sample(rows, key_x), p.max(axis=-1))
    accepted = num_draft if accept.all() else int(np.argmin(accept))
    return Verdict([int(t) for t in draft_token_ids[:accepted]], int(tokens[accepted])), \
        top[:accepted + 1]


def _verify_own_samples(p: mx.array, draft_token_ids: Sequence[int],
                        rng: np.random.Generator) -> tuple[Verdict, np.ndarray]:
    """A deterministic drafter's round (q one-hot; none at all for a plain step):
    the target samples its own token from every row, and the drafts are kept
    while they equal it (:func:`edgespec.core.acceptance.rejection_sample`). Row i gets
    the key a plain step at its position would get, and ``rng`` is left where
    plain sampling would leave it, so with one seed the tokens are plain
    sampling's."""
    num_draft = len(draft_token_ids)
    state = rng.bit_generator.state
    keys = [mx.random.split(key_from(rng))[1] for _ in range(num_draft + 1)]
    own, top = to_host(mx.concatenate([sample(p[i:i + 1], key) for i, key in enumerate(keys)]),
                       p.max(axis=-1))
    verdict = greedy_verify(own, draft_token_ids)  # kept while equal to the target's own tokens
    rng.bit_generator.state = state  # one key per committed token, as plain steps draw them
    for _ in range(verdict.num_accepted + 1):
        key_from(rng)
    return verdict, top[:verdict.num_accepted + 1]


def _exp_noise(keys: mx.array, ids: mx.array) -> mx.array:
    """:func:`edgespec.core.coupling.exp_noise` on the device: Exp(1) noise of ``ids``
    under ``keys`` (uint64, broadcast against each other), in float32."""
    c0, c1, c2 = (mx.array(np.array(c, dtype=np.uint64)) for c in MIX)
    x = keys + ids + c0
    x = (x ^ (x >> 30)) * c1
    x = (x ^ (x >> 27)) * c2
    x = x ^ (x >> 31)
    return -mx.log(((x >> (64 - UNIFORM_BITS)).astype(mx.float32) + 0.5) * (1.0 / (1 << UNIFORM_BITS)))


def coupled_pick(p: mx.array, coupling: Coupling, position: int) -> mx.array:
    """The token the coupling's noise decides for each row of ``p [n, V]`` (row i at
    context position ``position + i``): :func:`edgespec.core.coupling.race` on the device,
    with the same noise, so a draft model on MLX and a target elsewhere are coupled."""
    rows, vocab = p.shape
    blocks = -(-vocab // BLOCK)
    keys = [position_keys(coupling.seed, position + i) for i in range(rows)]
    id_keys, block_keys = (mx.array(np.array(column, dtype=np.uint64))[:, None] for column in zip(*keys))
    padded = mx.pad(p, [(0, 0), (0, blocks * BLOCK - vocab)])
    totals = padded.reshape(rows, blocks, BLOCK).sum(axis=-1)  # [n, blocks]
    block = mx.argmax(totals / _exp_noise(block_keys, mx.arange(blocks, dtype=mx.uint64)[None]), axis=-1)
    ids = block[:, None].astype(mx.int64) * BLOCK + mx.arange(BLOCK)[None]  # [n, BLOCK]
    inner = mx.take_along_axis(padded, ids.astype(mx.int32), axis=1)
    ratio = inner / _exp_noise(id_keys, ids.astype(mx.uint64))
    return (block * BLOCK + mx.argmax(mx.where(ids < vocab, ratio, -1.0), axis=-1)).astype(mx.int32)


def top_probability(logits: mx.array) -> mx.array:
    """The largest softmax probability of each row (temperature 1)."""
    x = logits.astype(mx.float32)
    return 1.0 / mx.exp(x - x.max(axis=-1, keepdims=True)).sum(axis=-1)
