"""Prompt lookup: propose what followed the last occurrence of the current n-gram.

No model runs: the drafter looks for the longest suffix of the context
(between ``min_ngram`` and ``max_ngram`` tokens) that occurred earlier in the
prompt or the generated text, and proposes the tokens that followed it. That
pays off when the answer copies from the conversation (code edits, quotes).
q is one-hot, so drafts are reported with ``probs=None``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..sampling import SamplingParams
from .base import Draft


def match_bucket(match_length: int) -> str:
    """How a draft is classed by its match: 2, 3, 4-7 or 8+ tokens (a 2-token
    match is often a coincidence, an 8-token one usually a copy in progress)."""
    return f"match{8 if match_length >= 8 else 4 if match_length >= 4 else match_length}"


class PromptLookup:
    """An n-gram drafter with an index that grows with the context.

    For each n it maps an n-gram to the end of its most recent earlier
    occurrence. Each new token adds at most ``max_ngram - min_ngram + 1``
    entries, so a round costs O(max_ngram), however long the context.
    """

    name = "lookup"

    def __init__(self, *, min_ngram: int = 2, max_ngram: int = 4):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram
        self.reset()

    def reset(self) -> None:
        """Forget the indexed context."""
        self._tokens: list[int] = []
        # _index[n][ngram] = e: tokens[e-n:e] == ngram and tokens[e] exists.
        self._index: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(self.min_ngram, self.max_ngram + 1)}

    def _extend_index(self, context: Sequence[int]) -> None:
        known = len(self._tokens)
        if len(context) < known or list(context[:known]) != self._tokens:
            self.reset()  # a different conversation (or an edited one): start over
            known = 0
        tokens = self._tokens
        tokens.extend(int(t) for t in context[known:])
        # Index every n-gram that has a continuation, i.e. ends before the last token.
        for end in range(max(known, 1), len(tokens)):
            for n, table in self._index.items():
                if end >= n:
                    table[tuple(tokens[end - n:end])] = end

    def propose(self, context: Sequence[int], num_draft: int, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        """Continue the longest earlier match of the context's suffix."""
        self._extend_index(context)
        tokens = self._tokens
        length = len(tokens)
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if length < n:
                continue
            end = self._index[n].get(tuple(tokens[length - n:]))
            if end is not None:
                return Draft(tokens[end:end + num_draft], None, match_bucket(n))
        return Draft([])

    def attach(self, target) -> None:
        """Prompt lookup drafts the target's own tokens: any target will do."""

    def close(self) -> None:
        """Nothing to free."""

    def prefill(self, context: Sequence[int]) -> int:
        """Index the prompt; no model runs, so nothing is evaluated."""
        self._extend_index(context)
        return 0

    def accepted(self, num_accepted: int) -> None:
        """Prompt lookup does not learn from acceptance."""

    def rewind(self, context: Sequence[int]) -> None:
        """Nothing to undo: the index only holds committed tokens."""
