"""Copies from the context: where the context's end occurred before, and what followed.

A reply that returns a file with a few changes copies long runs of the prompt:
once the context's last dozen tokens match an earlier passage, the next dozens
usually follow that passage too, up to the next change. :class:`CopyIndex`
finds such a source and says how long the match is, so that a planner can
tell a copy in progress (a long match) from a coincidence (two tokens), and
remembers where copies broke off:

- an index maps every n-gram (``min_ngram`` .. ``max_ngram`` tokens) to the
  end of its most recent occurrence, so a lookup costs O(max_ngram) however
  long the context;
- a match found there is measured backwards, token by token, up to
  ``max_match`` tokens: the match length;
- a copy in progress (the text went on as its source did) is followed even
  where a more recent occurrence of the last n-gram exists, as long as its own
  match is at least as long;
- **memory**: where the text parted from a copy (a draft was rejected, or the
  target's own token differed), the copy's key (the context's last ``max_ngram``
  tokens when it was offered) remembers how many of its tokens held and which
  token failed. A later copy after the same key stops before that token if it
  would draft the same one there, as llama.cpp's ngram-map-k drafts no more than
  was accepted last time from the same key. Unlike ngram-map-k's, this memory
  lets a copy that continues differently run on (a later turn copies the edited
  version, not the one that failed), and forgets a failure once the text goes
  through that point after the same key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Copy:
    """A proposed copy: ``tokens`` continue the context as they followed an earlier
    passage whose last ``match`` tokens equal the context's last ``match`` tokens."""

    tokens: list[int]
    match: int
    source: int  # the position in the context of the first copied token


class CopyIndex:
    """The n-gram index of a growing context, and the copies it offers."""

    def __init__(self, *, min_ngram: int = 2, max_ngram: int = 8, max_match: int = 64):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if max_match < max_ngram:
            raise ValueError(f"need max_match >= max_ngram, got {max_match} < {max_ngram}")
        self.min_ngram, self.max_ngram, self.max_match = min_ngram, max_ngram, max_match
        self.reset()

    def reset(self) -> None:
        """Forget the indexed context and the memory."""
        self.tokens: list[int] = []
        # _index[n][ngram] = e: tokens[e-n:e] == ngram and tokens[e] exists.
        self._index: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(self.min_ngram, self.max_ngram + 1)}
        # key -> (tokens that held, the token that failed) of the last copy after it that failed
        self.failed: dict[tuple[int, ...], tuple[int, int]] = {}
        self._last: tuple[int, int, tuple[int, ...]] | None = None  # (source, context length, key)

    def follow(self, context: Sequence[int]) -> None:
        """Index what is new in ``context`` (a different or edited context starts over),
        and learn how far the last copy offered held."""
        known = len(self.tokens)
        if len(context) < known or list(context[:known]) != self.tokens:
            self.reset()  # a different conversation (or an edited one): start over
            known = 0
        tokens = self.tokens
        tokens.extend(int(t) for t in context[known:])
        self._learn()
        # Index every n-gram that has a continuation, i.e. ends before the last token.
        for end in range(max(known, 1), len(tokens)):
            for n, table in self._index.items():
                if end >= n:
                    table[tuple(tokens[end - n:end])] = end

    def _learn(self) -> None:
        """Compare the tokens committed since the last copy was offered with its source:
        the first that differs is where that copy failed (remembered under its key); a
        failure the text now went through is forgotten; a copy still in step goes on."""
        if self._last is None:
            return
        source, at, key = self._last
        tokens = self.tokens
        for i in range(at, len(tokens)):
            position = source + i - at  # < i: the source lies before the text it predicts
            if tokens[i] != tokens[position]:
                self.failed[key] = (i - at, tokens[position])
                self._last = None
                return
        held = len(tokens) - at
        if key in self.failed and self.failed[key][0] < held:
            del self.failed[key]
        self._last = (source + held, len(tokens), self._key())

    def _key(self) -> tuple[int, ...]:
        return tuple(self.tokens[-self.max_ngram:])

    def match_length(self, end: int) -> int:
        """How many tokens before ``end`` equal the context's last tokens (at most max_match)."""
        tokens, length = self.tokens, len(self.tokens)
        n = 0
        while n < self.max_match and n < end and tokens[end - 1 - n] == tokens[length - 1 - n]:
            n += 1
        return n

    def find(self, num_draft: int) -> Copy | None:
        """The copy of the longest match of the context's end (of at least
        ``min_ngram`` tokens), up to ``num_draft`` tokens and stopping before the
        token that failed the last time a copy after this key was offered, if it
        would draft that token there again; None if there is none.

        Two candidates: the copy in progress, and the most recent occurrence of the
        longest indexed suffix. A copy that would stop before its first token gives
        way to the other."""
        tokens, length = self.tokens, len(self.tokens)
        candidates = []
        if self._last is not None and self._last[1] == length:
            candidates.append(self._last[0])  # the copy in progress
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if length >= n:
                end = self._index[n].get(tuple(tokens[length - n:]))
                if end is not None:
                    candidates.append(end)
                    break
        key = self._key()
        failed = self.failed.get(key)
        best: Copy | None = None
        for source in candidates:
            match = self.match_length(source)
            if match < self.min_ngram:
                continue
            copied = tokens[source:min(source + num_draft, length)]
            if failed is not None and failed[0] < len(copied) and copied[failed[0]] == failed[1]:
                copied = copied[:failed[0]]  # the same continuation failed there last time
            copy = Copy(copied, match, source)
            if best is None or (bool(copy.tokens), copy.match) > (bool(best.tokens), best.match):
                best = copy
        self._last = None if best is None else (best.source, length, key)
        return best


def match_bucket(match_length: int) -> str:
    """How a copy is classed by its match: 2, 3, 4-7, 8-15, 16-31 or 32+ tokens (a
    2-token match is often a coincidence, a 32-token one a copy in progress)."""
    for floor in (32, 16, 8, 4):
        if match_length >= floor:
            return f"match{floor}"
    return f"match{match_length}"
