"""A draft model on any backend: samples drafts from its own q."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..backends.base import Backend
from ..cache import CachedModel, common_prefix_length
from ..sampling import SamplingParams, logits_to_probs, sample_from
from .base import Draft


class DraftModel:
    """Propose tokens by running a (smaller) model autoregressively.

    The drafter's KV cache follows the committed context: before drafting it
    is synced to the context, evaluating only what is new since the last
    round. That covers the case where every draft was accepted: the drafter
    sampled its last draft token but never ran on it, so the sync evaluates
    that token together with the target's bonus token.
    """

    def __init__(self, backend: Backend, *, name: str | None = None):
        self.backend = backend
        self.name = name or backend.name
        self.cache = CachedModel(backend)

    def prefill(self, context: Sequence[int]) -> int:
        """Evaluate the prompt ahead of the first round; return tokens evaluated."""
        _, evaluated = self.cache.sync(context, need_logits=False)
        return evaluated

    def propose(self, context: Sequence[int], num_draft: int, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        """Sample up to ``num_draft`` tokens from the draft model's q."""
        if num_draft <= 0:
            return Draft([])
        logits, _ = self.cache.sync(context, need_logits=True)  # [V]
        token_ids: list[int] = []
        probs: list[np.ndarray] = []
        for i in range(num_draft):
            if params.greedy:
                token = int(np.argmax(logits))
            else:
                q = logits_to_probs(logits, params)  # [V]
                token = sample_from(q, rng)
                probs.append(q)
            token_ids.append(token)
            if i + 1 < num_draft:
                logits = self.cache.forward([token])[-1]
        # Greedy drafts are one-hot in q, which the verifier reads from None.
        return Draft(token_ids, np.stack(probs) if probs else None)

    def accepted(self, num_accepted: int) -> None:
        """Nothing to learn; the next sync trims the rejected drafts."""

    def rewind(self, context: Sequence[int]) -> None:
        """Drop cached draft tokens that are not part of ``context``."""
        self.cache.rewind(common_prefix_length(self.cache.tokens, context))

    def reset(self) -> None:
        """Empty the draft model's cache."""
        self.cache.rewind(0)
