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
  through that point after the same key;
- **picking up again**: after a copy breaks (an edit), the text usually goes on
  copying the same source just past the break. A match there, however short, is
  offered as the copy resumed (``Copy.resumed``) before a more recent occurrence
  elsewhere;
- **where copies break**: every token committed while a copy is followed says
  whether it held; :class:`~edgespec.drafters.breaks.BreakModel` learns from them
  where in the source copies break, and each copy offered carries, per token, the
  chance that it holds (``Copy.hold``);
- **conversations**: a client interleaves them (an edit, a side request, the next
  edit). The index of one it leaves is kept (the last ``KEPT`` of them, as the prompt
  cache keeps their KV states), and comes back, with what it learned, when a context
  continues it.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from ..core.config import DEFAULT_CONFIG, PlannerConfig
from .breaks import BreakModel, SourceLines



# Conversations whose index is kept when a context leaves them, and the shortest kept.
KEPT = 4
KEEP_MIN_TOKENS = 64
# Bytes of host memory per n-gram key of the index and per token (with its line
# features), fitted on what tracemalloc counts for indexes of 500 to 12,000 tokens of
# copy-rich and random text: 0.9-1.45 times it (over, not under, on short ones).
KEY_BYTES, TOKEN_BYTES = 192, 40
# What one conversation's index is (reset() makes these anew).
CONVERSATION_STATE = ("tokens", "_index", "failed", "_last", "resume_at", "breaks", "lines")


@dataclass
class _Followed:
    """The copy offered last, followed as the text is committed."""

    source: int  # the position in the context of the next token it predicts
    at: int      # the context's length when it was offered or last checked
    key: tuple[int, ...]  # the context's last max_ngram tokens when it was offered
    run: int     # how long it has held: its match when first offered, and every token since
    held: int = 0  # the tokens committed that it predicted


@dataclass(frozen=True)
class Copy:
    """A proposed copy: ``tokens`` continue the context as they followed an earlier
    passage whose last ``match`` tokens equal the context's last ``match`` tokens."""

    tokens: list[int]
    match: int
    source: int  # the position in the context of the first copied token
    resumed: bool = False  # picks up the copy that broke last, just past where it broke
    hold: tuple[float, ...] = ()  # per token: the chance it holds, if the ones before held


class CopyIndex:
    """The n-gram index of a growing context, and the copies it offers."""

    def __init__(self, *, min_ngram: int = 2, max_ngram: int = 8, max_match: int = 64,
                 token_bytes: Callable[[int], bytes] | None = None,
                 config: PlannerConfig = DEFAULT_CONFIG):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if max_match < max_ngram:
            raise ValueError(f"need max_match >= max_ngram, got {max_match} < {max_ngram}")
        self.min_ngram, self.max_ngram, self.max_match = min_ngram, max_ngram, max_match
        self.config = config  # resume_window, resume_after, run_priors
        self.lines = SourceLines(token_bytes)
        self._kept: list[dict] = []  # other conversations' indexes, least recently left first
        self.reset()

    def set_vocabulary(self, token_bytes: Callable[[int], bytes]) -> None:
        """Learn which ids end lines (the break model's line features), from the target's
        vocabulary; the indexed context is read again."""
        self.lines = SourceLines(token_bytes)
        self._kept = []  # (read with another vocabulary)
        self.reset()

    def reset(self) -> None:
        """Forget the indexed context and the memory (other conversations' stay)."""
        self.tokens: list[int] = []
        # _index[n][ngram] = [e, ...]: every e (ascending) with tokens[e-n:e] == ngram and
        # tokens[e] existing.
        self._index: dict[int, dict[tuple[int, ...], list[int]]] = {
            n: {} for n in range(self.min_ngram, self.max_ngram + 1)}
        # key -> (tokens that held, the token that failed) of the last copy after it that failed
        self.failed: dict[tuple[int, ...], tuple[int, int]] = {}
        self._last: _Followed | None = None  # the copy offered last
        self.resume_at: int | None = None  # the source position where the last copy broke
        self.breaks = BreakModel(self.config.run_priors)
        self.lines = self.lines.anew()  # (a kept conversation keeps the one it had)

    def follow(self, context: Sequence[int]) -> None:
        """Index what is new in ``context`` (a different or edited context starts over),
        and learn how far the last copy offered held."""
        known = len(self.tokens)
        if len(context) < known or list(context[:known]) != self.tokens:
            self._switch(context)  # another conversation (or an edited one)
            known = len(self.tokens)
        tokens = self.tokens
        tokens.extend(int(t) for t in context[known:])
        self.lines.extend(tokens, known)
        self._learn()
        # Index every n-gram that has a continuation, i.e. ends before the last token.
        for end in range(max(known, 1), len(tokens)):
            for n, table in self._index.items():
                if end >= n:
                    table.setdefault(tuple(tokens[end - n:end]), []).append(end)

    def _switch(self, context: Sequence[int]) -> None:
        """Leave the indexed conversation for ``context``: keep its index (if it is long
        enough to be worth it), and take back the kept one that ``context`` continues
        (the longest), or start over."""
        if len(self.tokens) >= KEEP_MIN_TOKENS:
            self._kept.append({k: getattr(self, k) for k in CONVERSATION_STATE})
            self._kept[-1]["left"] = time.monotonic()  # (when it was last used, for the budget)
            del self._kept[:-KEPT]
        fits = [i for i, kept in enumerate(self._kept) if len(kept["tokens"]) <= len(context)
                and list(context[:len(kept["tokens"])]) == kept["tokens"]]
        if fits:
            best = max(fits, key=lambda i: len(self._kept[i]["tokens"]))
            for name in CONVERSATION_STATE:
                setattr(self, name, self._kept[best][name])
            del self._kept[best]
        else:
            self.reset()

    def memory_bytes(self) -> int:
        """Host memory the index holds, the kept conversations' too (estimated from its
        keys and tokens: see KEY_BYTES)."""
        return sum(_index_bytes(c["_index"], c["tokens"]) for c in self._kept) + \
            _index_bytes(self._index, self.tokens)

    def oldest_kept(self) -> float | None:
        """When the least recently left kept conversation was left (None: none kept)."""
        return self._kept[0]["left"] if self._kept else None

    def drop_oldest_kept(self) -> None:
        """Drop the least recently left kept conversation's index (the budget is full)."""
        del self._kept[:1]

    def _learn(self) -> None:
        """Compare the tokens committed since the last copy was offered with its source:
        the first that differs is where that copy failed (remembered under its key); a
        failure the text now went through is forgotten; a copy still in step goes on."""
        last = self._last
        if last is None:
            return
        tokens = self.tokens
        for i in range(last.at, len(tokens)):
            position = last.source + i - last.at  # < i: the source lies before the text it predicts
            broke = tokens[i] != tokens[position]
            self.breaks.observe(last.run + i - last.at, self._features(position, i), broke)
            if broke:
                self.failed[last.key] = (i - last.at, tokens[position])
                if last.held + i - last.at >= self.config.resume_after:  # a copy in progress broke, not a guess
                    self.resume_at = position
                self._last = None
                return
        held = len(tokens) - last.at
        if last.key in self.failed and self.failed[last.key][0] < held:
            del self.failed[last.key]
        last.source, last.at, last.key = last.source + held, len(tokens), self._key()
        last.run, last.held = last.run + held, last.held + held

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

        Three candidates: the copy in progress, the copy that broke last picked up
        again (the nearest occurrence of the longest suffix just past where it broke),
        and the most recent occurrence of the longest indexed suffix. The longest match
        wins, the copy picked up again on a tie; a copy that would stop before its first
        token gives way to the others."""
        tokens, length = self.tokens, len(self.tokens)
        candidates = []  # (source, resumed)
        last = self._last if self._last is not None and self._last.at == length else None
        if last is not None:
            candidates.append((last.source, False))  # the copy in progress
        resume = self._resume_source()
        if resume is not None:
            candidates.append((resume, True))
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if length >= n:
                ends = self._index[n].get(tuple(tokens[length - n:]))
                if ends:
                    candidates.append((ends[-1], False))
                    break
        key = self._key()
        failed = self.failed.get(key)
        best: Copy | None = None
        for source, resumed in candidates:
            match = self.match_length(source)
            if match < self.min_ngram:
                continue
            copied = tokens[source:min(source + num_draft, length)]
            if failed is not None and failed[0] < len(copied) and copied[failed[0]] == failed[1]:
                copied = copied[:failed[0]]  # the same continuation failed there last time
            copy = Copy(copied, match, source, resumed)
            if best is None or (bool(copy.tokens), copy.match) > (bool(best.tokens), best.match):
                best = copy
        if best is None:
            self._last = None
            return None
        if last is None or last.source != best.source:  # (the copy in progress goes on counting)
            last = _Followed(best.source, length, key, best.match)
        last.key, last.run = key, max(last.run, best.match)
        self._last = last
        hold = tuple(1.0 - self.breaks.hazard(last.run + j, self._features(best.source + j, length + j))
                     for j in range(len(best.tokens)))
        return Copy(best.tokens, best.match, best.source, best.resumed, hold)

    def _features(self, position: int, at: int) -> list:
        """What the source holds at ``position``, copied to ``at`` (BreakModel features):
        its line's structure, and how far back it lies (a copy of the last few lines is
        more often a guess than one of a file far back)."""
        distance = at - position
        far = 0 if distance < 64 else 1 if distance < 512 else 2
        return self.lines.features(self.tokens, position) + [("far", far)]

    def _resume_source(self) -> int | None:
        """Where the copy that broke last goes on, if the context's end matches the source
        just past the break: the nearest such occurrence of the longest suffix (of at least
        ``min_ngram`` tokens), within the config's ``resume_window`` tokens after the break."""
        if self.resume_at is None:
            return None
        tokens, length, start = self.tokens, len(self.tokens), self.resume_at
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if length < n:
                continue
            ends = self._index[n].get(tuple(tokens[length - n:]))
            if ends:
                i = bisect.bisect_left(ends, start)
                if i < len(ends) and ends[i] <= start + self.config.resume_window and ends[i] < length - n:
                    return ends[i]
        return None


def match_bucket(match_length: int) -> str:
    """How a copy is classed by its match: 2, 3, 4-7, 8-15, 16-31 or 32+ tokens (a
    2-token match is often a coincidence, a 32-token one a copy in progress)."""
    for floor in (32, 16, 8, 4):
        if match_length >= floor:
            return f"match{floor}"
    return f"match{match_length}"


def copy_bucket(copy: Copy) -> str:
    """How a copy is classed for a planner: by its match (:func:`match_bucket`), and a
    copy picked up again just past where it broke by that, unless its match is long."""
    return "resume" if copy.resumed and copy.match < 16 else match_bucket(copy.match)


def _index_bytes(index: dict[int, dict], tokens: list[int]) -> int:
    return KEY_BYTES * sum(len(table) for table in index.values()) + TOKEN_BYTES * len(tokens)
