"""A draft model on any backend: samples drafts from its own q."""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from ..backends.base import Backend
from ..cache import CachedModel, common_prefix_length
from ..sampling import SamplingParams, logits_to_probs, sample_from, top_probability
from .base import Draft


class DraftModel:
    """Propose tokens by running a (smaller) model autoregressively.

    The drafter's KV cache follows the committed context: before drafting it
    is synced to the context, evaluating only what is new since the last
    round. That covers the case where every draft was accepted: the drafter
    sampled its last draft token but never ran on it, so the sync evaluates
    that token together with the target's bonus token.
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
        self.last_steps = 0  # draft-model passes of the last proposal, and their time
        self.last_step_seconds = 0.0
        self.last_catch_up = 0  # tokens of a catch-up before the last proposal, and its time
        self.last_catch_up_seconds = 0.0

    def prefill(self, context: Sequence[int]) -> int:
        """Evaluate the prompt ahead of the first round; return tokens evaluated."""
        _, evaluated = self.cache.sync(context, need_logits=False)
        return evaluated

    def propose(self, context: Sequence[int], num_draft: int, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        """Sample up to ``num_draft`` tokens from the draft model's q."""
        # The draft cache will hold the context and all drafts but the last.
        num_draft = min(num_draft, self.backend.n_ctx - len(context) + 1)
        if num_draft <= 0:
            return Draft([])
        start = time.perf_counter()
        logits, evaluated = self.cache.sync(context, need_logits=True)  # [V]
        # The sync is normally one step (the last committed token or two). A long
        # catch-up after plain decoding is not a drafting step: keep it out of the cost.
        catch_up = evaluated > 2
        self.last_steps = 0 if catch_up else 1
        counted_from = time.perf_counter() if catch_up else start
        self.last_catch_up = evaluated if catch_up else 0
        self.last_catch_up_seconds = counted_from - start  # 0 without a catch-up
        token_ids: list[int] = []
        probs: list[np.ndarray] = []
        for i in range(num_draft):
            if params.greedy:
                if self.min_confidence and top_probability(logits) < self.min_confidence:
                    break
                token = int(np.argmax(logits))
            else:
                q = logits_to_probs(logits, params)  # [V]
                if self.min_confidence and q.max() < self.min_confidence:
                    break
                token = sample_from(q, rng)
                probs.append(q)
            token_ids.append(token)
            if i + 1 < num_draft:
                logits = self.cache.forward([token])[-1]
                self.last_steps += 1
        self.last_step_seconds = time.perf_counter() - counted_from
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
