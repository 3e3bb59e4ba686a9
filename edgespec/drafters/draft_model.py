"""A draft model on any backend: samples drafts from its own q."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..core.backend import Backend
from ..core.cache import CachedModel, common_prefix_length
from ..core.coupling import Coupling
from ..core.sampling import (SamplingParams, Scratch, logits_to_probs, sample_from, top_probability,
                             weights_and_blocks)
from ..core.draft import MODEL, Draft, DrafterBase


class DraftModel(DrafterBase):
    """Propose tokens by running a (smaller) model autoregressively.

    The drafter's KV cache follows the committed context: :meth:`prefill`
    syncs it, evaluating only what is new since the last round, and keeps the
    logits after the context for the first draft. That covers the case where
    every draft was accepted: the drafter sampled its last draft token but
    never ran on it, so the sync evaluates that token together with the
    target's bonus token.
    """

    def __init__(self, backend: Backend, *, name: str | None = None, min_confidence: float = 0.0):
        if not 0.0 <= min_confidence < 1.0:
            raise ValueError(f"invalid min_confidence={min_confidence!r}: must be 0 <= p < 1")
        self.backend = backend
        self.name = name or backend.name
        self.cache = CachedModel(backend)
        # Stop drafting when the draft model's own top probability falls below this
        # (llama.cpp's --draft-p-min). The test looks only at the draft model's
        # distribution before sampling, so proposals stay exactly distributed as q.
        self.min_confidence = min_confidence
        self._next_logits: np.ndarray | None = None  # [V] after the cached tokens
        self._logits_at = 0  # the cache's restores when they were computed (a restore voids them)
        # q of each draft on the host: a draft's probs are read until it is verified,
        # and the next proposal overwrites them.
        self._scratch = Scratch()

    @property
    def n_ctx(self) -> int:
        """The draft model's context (the engine fills no more than the smallest)."""
        return self.backend.n_ctx

    def attach(self, target: Backend) -> None:
        """Refuse a target whose vocabulary this model cannot draft for."""
        from ..backends.compat import check_compatible
        check_compatible(target, self.backend)

    def prefill(self, context: Sequence[int]) -> int:
        """Make the cache hold ``context`` (with the logits after it); return tokens evaluated.

        A context with a token this model's vocabulary lacks (a target may have up
        to 128 more) cannot be read past it: the model then drafts nothing for the
        rest of that context, and decoding goes on without it.
        """
        if self.backend.n_past != len(self.cache.tokens):
            self.reset()  # the model ran outside this cache (a cost calibration): start afresh
        if self._next_logits is not None and self._logits_at == self.cache.restores \
                and len(self.cache.tokens) == len(context) \
                and common_prefix_length(self.cache.tokens, context) == len(context):
            return 0
        self._next_logits = None
        if not self._can_read(context):
            return 0
        logits, evaluated = self.cache.sync(context, need_logits=True, on_device=self.cache.on_device())
        self._next_logits, self._logits_at = logits, self.cache.restores
        return evaluated

    kind = MODEL

    shapes_q = True

    def propose(self, context: Sequence[int], num_draft: int, params: SamplingParams,
                rng: np.random.Generator | Coupling, *, min_confidence: float | None = None,
                shaping=None) -> Draft:
        """Sample up to ``num_draft`` tokens from the draft model's q (with a
        :class:`~edgespec.core.coupling.Coupling`, the tokens its noise decides under q),
        stopping where its top probability falls below ``min_confidence`` (None: the
        stop it was made with). ``shaping``: a request's bias, penalties or grammar,
        applied to q as the target applies them to p, so that drafts the target could
        not take are not drafted (on the host, also for an MLX draft model)."""
        stop = self.min_confidence if min_confidence is None else min_confidence
        self.prefill(context)
        logits, self._next_logits = self._next_logits, None
        if logits is None:  # a token it cannot read
            return Draft([])
        if self.cache.on_device(shaping=shaping):
            return self._propose_on_device(context, logits, num_draft, params, rng, stop)
        logits = np.asarray(logits)  # (left on the device by a prefill, for a shaped request)
        token_ids: list[int] = []
        confidence: list[float] = []  # the top probability before each draft (with a stop)
        # q of each draft up to a factor (q = weights × scale), written in place
        # (greedy drafts are one-hot in q, which the verifier reads from None).
        probs = None if params.greedy else self._scratch.rows(num_draft, logits.shape[-1])
        scales = None if probs is None else np.empty(num_draft)
        for i in range(num_draft):
            if shaping is not None:
                logits = shaping.row_after(logits, context, token_ids)
            weights, blocks = (None, None) if probs is None else \
                weights_and_blocks(logits, params, out=probs[i])
            if weights is not None:
                scales[i] = 1.0 / blocks.sum()
            if stop:  # looks at q before sampling: drafts stay distributed as q
                sure = float(top_probability(logits) if weights is None else weights.max() * scales[i])
                if sure < stop:
                    break
                confidence.append(sure)
            token = int(np.argmax(logits)) if weights is None else \
                self.draw(weights, blocks, rng, len(context) + i)
            token_ids.append(token)
            if i + 1 < num_draft:
                logits = self.cache.forward([token])[-1]
        if probs is None or not token_ids:
            return Draft(token_ids, confidence=confidence if stop else None)
        return Draft(token_ids, probs[:len(token_ids)], confidence=confidence if stop else None,
                     scales=scales[:len(token_ids)])

    @staticmethod
    def draw(weights: np.ndarray, blocks: np.ndarray, rng: np.random.Generator | Coupling,
             position: int) -> int:
        """One draft token from q (``weights`` up to a factor, and their block sums), at
        context ``position``: the draft must be drawn from the q the draft reports, which
        ``edgespec verify`` checks by calling this on recorded rows."""
        if isinstance(rng, Coupling):
            return rng.pick(weights, blocks, position)
        return sample_from(weights, rng, blocks)

    def _propose_on_device(self, context: Sequence[int], logits, num_draft: int,
                           params: SamplingParams, rng: np.random.Generator | Coupling,
                           stop: float) -> Draft:
        """The same draft as :meth:`propose`'s loop, built as one lazy MLX graph (each
        sampled token feeds the next forward on the device) and evaluated once.

        The confidence stop is applied afterwards, on the host: it looks only at q
        before each token is sampled, so the kept drafts are exactly the loop's;
        the passes past the stop are wasted device work, not a round trip each.
        """
        import mlx.core as mx

        from ..backends import mlx_ops
        coupled = isinstance(rng, Coupling)
        keys = None if params.greedy or coupled else mx.random.split(mlx_ops.key_from(rng), num_draft)
        tokens, confidence, probs = [], [], []
        for i in range(num_draft):
            if params.greedy:
                token = mx.argmax(logits)
                if stop:
                    confidence.append(top_probability(logits[None])[0])
            else:
                q = logits_to_probs(logits[None], params)  # [1, V], on the device
                token = rng.picks(q, len(context) + i)[0] if coupled else mlx_ops.sample(q[0], keys[i])
                if stop:
                    confidence.append(q.max())
                probs.append(q[0])
            tokens.append(token)
            if i + 1 < num_draft:
                logits = self.backend.forward(token.reshape(1), lazy=True)[-1]
        q_rows = mx.stack(probs) if probs else None
        to_host = [mx.stack(tokens)] + ([mx.stack(confidence)] if confidence else [])
        ids, *confidence = mlx_ops.to_host(*to_host, also=[] if q_rows is None else [q_rows])
        kept, sure = num_draft, None
        if confidence:  # the stop, where the draft model's confidence fell below it
            unsure = np.flatnonzero(confidence[0] < stop)
            kept = int(unsure[0]) if len(unsure) else num_draft
            sure = [float(x) for x in confidence[0][:kept]]
        # As the loop leaves it: the cache holds the context and every draft but the
        # last, or all of them when it stopped early.
        self.cache.record(ids[:num_draft - 1])
        self.cache.rewind(len(context) + min(kept, num_draft - 1))
        return Draft([int(t) for t in ids[:kept]], None if q_rows is None else q_rows[:kept],
                     confidence=sure)

    def _can_read(self, context: Sequence[int]) -> bool:
        """Whether every token of ``context`` not in the cache is in this vocabulary."""
        size = self.backend.vocab.size
        start = common_prefix_length(self.cache.tokens, context)
        return all(0 <= t < size for t in context[start:])

    def rewind(self, context: Sequence[int]) -> None:
        """Drop cached draft tokens that are not part of ``context``."""
        keep = common_prefix_length(self.cache.tokens, context)
        if keep < len(self.cache.tokens):
            self._next_logits = None
        self.cache.rewind(keep)

    def memory(self) -> dict[str, int]:
        """The logits kept after the context (one row of the vocabulary)."""
        logits = self._next_logits
        return {"draft_logits": int(logits.nbytes) if logits is not None else 0}

    def reset(self) -> None:
        """Empty the draft model's cache."""
        self._next_logits = None
        self.cache.rewind(0)

    def close(self) -> None:
        """Free the model."""
        self._next_logits = None
        self.backend.close()
