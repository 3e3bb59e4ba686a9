"""Prompt lookup: propose what followed an earlier occurrence of the context's end.

No model runs: the drafter looks for the longest suffix of the context
(between ``min_ngram`` and ``max_ngram`` tokens) that occurred earlier in the
prompt or the generated text, and proposes the tokens that followed it. That
pays off when the answer copies from the conversation (code edits, quotes).
Each draft is classed by how far back its match reaches (up to ``max_match``
tokens; :func:`~edgespec.drafters.copying.match_bucket`), so that a planner can
draft far along a copy in progress and not at all on a coincidence; where a
copy of the same source broke off before, the draft stops just before that
point (:class:`~edgespec.drafters.copying.CopyIndex`). q is one-hot, so
drafts are reported with ``probs=None``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..core.config import DEFAULT_CONFIG, PlannerConfig
from ..core.sampling import SamplingParams
from ..core.draft import COPY, Draft, DrafterBase
from .copying import CopyIndex, copy_bucket, match_bucket

__all__ = ["PromptLookup", "match_bucket"]


class PromptLookup(DrafterBase):
    """An n-gram drafter over the context, with an index that grows with it.

    Each new token adds at most ``max_ngram - min_ngram + 1`` index entries,
    and a lookup measures a match over at most ``max_match`` tokens, so a
    round costs O(max_ngram + max_match), however long the context.
    """

    name = "lookup"
    kind = COPY

    def __init__(self, *, min_ngram: int = 2, max_ngram: int = 8, max_match: int = 64,
                 config: PlannerConfig = DEFAULT_CONFIG):
        self.copies = CopyIndex(min_ngram=min_ngram, max_ngram=max_ngram,
                                max_match=max(max_match, max_ngram), config=config)
        self.min_ngram, self.max_ngram = min_ngram, max_ngram

    def reset(self) -> None:
        """Forget the indexed context (and where its copies broke off)."""
        self.copies.reset()

    def propose(self, context: Sequence[int], num_draft: int, params: SamplingParams,
                rng: np.random.Generator, *, min_confidence: float | None = None) -> Draft:
        """Continue the longest earlier match of the context's suffix."""
        self.copies.follow(context)
        copy = self.copies.find(num_draft)
        if copy is None or not copy.tokens:
            return Draft([])
        return Draft(copy.tokens, None, copy_bucket(copy), hold=list(copy.hold))

    def memory(self) -> dict[str, int]:
        """The copy index's bytes (the kept conversations' too)."""
        return {"copy_indexes": self.copies.memory_bytes()}

    def oldest_memory(self) -> float | None:
        return self.copies.oldest_kept()

    def drop_oldest_memory(self) -> None:
        self.copies.drop_oldest_kept()

    def attach(self, target) -> None:
        """Prompt lookup drafts the target's own tokens: any target will do. Its
        vocabulary tells which tokens end lines (where copies break is learned by line)."""
        self.copies.set_vocabulary(target.token_bytes)

    def prefill(self, context: Sequence[int]) -> int:
        """Index the prompt; no model runs, so nothing is evaluated. (The committed
        text shows where a copy held: :meth:`CopyIndex.follow` reads it here.)"""
        self.copies.follow(context)
        return 0
