"""Suffix drafting: continue the context the way it, or an earlier conversation, went on.

Prompt lookup remembers only the last place each n-gram occurred, in the
current context. This drafter counts, for every n-gram (n = 1 ..
``max_ngram``), which tokens followed it and how often, over the current
context *and* a bounded memory of earlier contexts of this engine (earlier
conversations, regenerated replies). A draft follows the longest n-gram
match of the context's end, taking the most frequent continuation each step,
and stops when the product of those continuations' empirical frequencies
falls below ``min_confidence`` (the idea of SuffixDecoding, Oliaro et al.
2024, on n-gram counts instead of a suffix tree). Drafts are deterministic:
q is one-hot and ``probs=None``, so the acceptance rule keeps the target's
distribution exactly.

Where the current context matches an earlier passage of itself further back
than the counts' longest n-gram (a reply that copies a file from the prompt),
the drafter copies it as prompt lookup does
(:class:`~edgespec.drafters.copying.CopyIndex`): as far as the draft may go,
classed by the match's length, and stopping where a copy of the same source
broke off before. The counts draft the rest.

Work per committed token is O(max_ngram²) however long the context and the
memory; the memory holds at most ``memory_tokens`` tokens (oldest contexts
evicted first, their counts taken back).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Sequence

import numpy as np

from ..core.cache import common_prefix_length
from ..core.config import DEFAULT_CONFIG, PlannerConfig
from ..core.sampling import SamplingParams
from ..core.draft import COPY, Draft, DrafterBase
from .copying import TOKEN_BYTES, CopyIndex, copy_bucket

# A context that differs from the one indexed in more than this many tokens is a
# new conversation: the old one goes to the memory instead of being un-indexed.
NEW_CONVERSATION = 32


# Bytes of host memory per counted n-gram (its key and its followers), fitted on what
# tracemalloc counts for 500 to 12,000 tokens: 0.94-1.2 times it.
COUNT_KEY_BYTES = 330


class NgramCounts:
    """For each n-gram of length 1..max_ngram: how often each token followed it."""

    def __init__(self, max_ngram: int):
        self.max_ngram = max_ngram
        self.tables: list[dict[tuple[int, ...], dict[int, int]]] = [{} for _ in range(max_ngram + 1)]
        self.operations = 0  # table updates made (for tests of the work per token)

    def count(self, tokens: Sequence[int], start: int, stop: int, sign: int = 1) -> None:
        """Add (``sign=-1``: take back) the continuations ``tokens[start:stop]``."""
        for end in range(max(start, 1), stop):
            follower = tokens[end]
            for n in range(1, min(self.max_ngram, end) + 1):
                key = tuple(tokens[end - n:end])
                table = self.tables[n]
                followers = table.get(key)
                if followers is None:
                    followers = table[key] = {}
                # Counted again, a follower moves to the end: followers stay in the order
                # they were last seen, for ties to go to the most recent.
                count = (followers.pop(follower, 0) if sign > 0 else followers.get(follower, 0)) + sign
                if count > 0:
                    followers[follower] = count
                else:
                    followers.pop(follower, None)
                    if not followers:
                        del table[key]
                self.operations += 1

    def keys(self) -> int:
        """The n-grams counted."""
        return sum(len(table) for table in self.tables)

    def continuation(self, tokens: Sequence[int], min_ngram: int) -> tuple[int, float, int] | None:
        """The most frequent follower of the longest counted suffix of ``tokens``
        (at least ``min_ngram`` long; of equally frequent ones, the one seen last:
        a conversation that edits code goes on from its latest version): (token,
        its frequency there, n), or None."""
        for n in range(min(self.max_ngram, len(tokens)), min_ngram - 1, -1):
            followers = self.tables[n].get(tuple(tokens[len(tokens) - n:]))
            if followers:
                token, count = max(reversed(followers.items()), key=lambda item: item[1])
                return token, count / sum(followers.values()), n
        return None

    def size(self) -> int:
        """Counted (n-gram, follower) pairs: what the memory costs."""
        return sum(len(followers) for table in self.tables for followers in table.values())


class SuffixDrafter(DrafterBase):
    """Drafts from continuation counts over the context and earlier contexts."""

    name = "suffix"
    kind = COPY

    def __init__(self, *, max_ngram: int = 8, min_ngram: int = 2, min_confidence: float = 0.3,
                 memory_tokens: int = 16384, max_match: int = 64,
                 config: PlannerConfig = DEFAULT_CONFIG):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if not 0.0 <= min_confidence < 1.0:
            raise ValueError(f"invalid min_confidence={min_confidence!r}: must be 0 <= p < 1")
        if memory_tokens < 0:
            raise ValueError(f"invalid memory_tokens={memory_tokens!r}: must be >= 0")
        self.min_ngram, self.min_confidence = min_ngram, min_confidence
        self.memory_tokens = memory_tokens
        self.counts = NgramCounts(max_ngram)
        self.copies = CopyIndex(min_ngram=min_ngram, max_ngram=max_ngram,
                                max_match=max(max_match, max_ngram), config=config)  # over the live context
        self._live: list[int] = []  # the context indexed now
        self._memory: deque[list[int]] = deque()  # earlier contexts, oldest first
        self._left: deque[float] = deque()  # when each was left (time.monotonic())
        self._remembered = 0  # tokens in the memory

    # -- the drafter protocol ---------------------------------------------------------

    def attach(self, target) -> None:
        """It drafts the target's own tokens: any target will do. Its vocabulary tells
        which tokens end lines (where copies break is learned by line)."""
        self.copies.set_vocabulary(target.token_bytes)

    def prefill(self, context: Sequence[int]) -> int:
        """Index what is new in ``context``; no model runs, so nothing is evaluated."""
        self._follow(context)
        return 0

    def propose(self, context: Sequence[int], num_draft: int, params: SamplingParams,
                rng: np.random.Generator, *, min_confidence: float | None = None) -> Draft:
        """The live context's longest copy, or the most likely continuation by the
        counts, as long as it stays likely enough."""
        self._follow(context)
        # Only the last max_ngram tokens are ever matched: copy those, not the context.
        tokens = self._live[-self.counts.max_ngram:]
        found = self.counts.continuation(tokens, self.min_ngram)
        copy = self.copies.find(num_draft)
        if copy is not None and copy.tokens and (copy.match >= self.counts.max_ngram or copy.resumed):
            return Draft(copy.tokens, None, copy_bucket(copy), hold=list(copy.hold))
        draft, confidence, first_n = [], 1.0, 0
        while len(draft) < num_draft and found is not None:
            token, frequency, n = found
            confidence *= frequency
            if confidence < self.min_confidence:
                break
            first_n = first_n or n
            draft.append(token)
            tokens.append(token)
            found = self.counts.continuation(tokens, self.min_ngram)
        if not draft:
            return Draft([])
        return Draft(draft, None, confidence_bucket(first_n, confidence))

    def reset(self) -> None:
        """Forget the current context (the memory of earlier ones stays)."""
        self._forget_tail(0)

    def forget(self) -> None:
        """Forget everything: the current context and the memory."""
        self.reset()
        while self._memory:
            self._evict()

    def memory(self) -> dict[str, int]:
        """The counts' bytes (over the live context and the memory) and the copy index's."""
        return {"suffix_counts": COUNT_KEY_BYTES * self.counts.keys() +
                TOKEN_BYTES * (len(self._live) + self._remembered),
                "copy_indexes": self.copies.memory_bytes()}

    def oldest_memory(self) -> float | None:
        """The earlier context, or the kept copy index, left longest ago."""
        times = [t for t in (self._left[0] if self._left else None, self.copies.oldest_kept())
                 if t is not None]
        return min(times, default=None)

    def drop_oldest_memory(self) -> None:
        if self._left and (self.copies.oldest_kept() is None or self._left[0] <= self.copies.oldest_kept()):
            self._evict()
        else:
            self.copies.drop_oldest_kept()

    def close(self) -> None:
        """Nothing to free but memory."""
        self.forget()

    # -- bookkeeping ----------------------------------------------------------------------

    @property
    def remembered_tokens(self) -> int:
        """Tokens of earlier contexts kept in the memory."""
        return self._remembered

    def _follow(self, context: Sequence[int]) -> None:
        """Make the indexed context ``context``: extend it, cut it back, or, for a
        different conversation, move the old one to the memory."""
        live = self._live
        common = common_prefix_length(live, context)
        if common < len(live):
            if len(live) - common > NEW_CONVERSATION:
                self._remember(live)
                self._live = live = []
                common = 0
            else:  # a short tail differs (an edited or regenerated turn): take it back
                self._forget_tail(common)
        start = len(live)
        live.extend(int(t) for t in context[start:])
        self.counts.count(live, start, len(live))
        self.copies.follow(live)

    def _forget_tail(self, keep: int) -> None:
        self.counts.count(self._live, keep, len(self._live), sign=-1)
        del self._live[keep:]

    def _remember(self, tokens: list[int]) -> None:
        """Keep ``tokens`` (already counted) in the memory, evicting the oldest."""
        if self.memory_tokens == 0:
            self.counts.count(tokens, 0, len(tokens), sign=-1)
            return
        self._memory.append(tokens)
        self._left.append(time.monotonic())
        self._remembered += len(tokens)
        while self._remembered > self.memory_tokens:
            self._evict()

    def _evict(self) -> None:
        oldest = self._memory.popleft()
        self._left.popleft()
        self._remembered -= len(oldest)
        self.counts.count(oldest, 0, len(oldest), sign=-1)


def confidence_bucket(match: int, confidence: float) -> str:
    """How sure a draft is, for planners that track acceptance by kind: the first
    match's length (short matches are often coincidences) and the draft's
    empirical probability."""
    sure = "sure" if confidence >= 0.8 else "likely" if confidence >= 0.5 else "maybe"
    return f"{sure}{'-long' if match >= 4 else ''}"
