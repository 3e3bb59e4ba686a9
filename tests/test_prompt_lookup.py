
import numpy as np

from edgespec import PromptLookup, SamplingParams
from edgespec.drafters.copying import CopyIndex

PARAMS = SamplingParams(temperature=0)
RNG = np.random.default_rng(0)


def test_proposes_what_followed_the_longest_earlier_match():
    lookup = PromptLookup(min_ngram=1, max_ngram=3)
    #          0  1  2  3  4  5  6  7  8
    context = [5, 6, 7, 8, 9, 1, 6, 7, 2, 6, 7]
    # suffix [6, 7] occurred twice; [2, 6, 7] never; the most recent [6, 7] ended at 8.
    assert lookup.propose(context, 3, PARAMS, RNG).token_ids == [2, 6, 7]
    # Longer match wins over recency: suffix [5, 6] matches the 2-gram at the start.
    lookup2 = PromptLookup(min_ngram=1, max_ngram=3)
    assert lookup2.propose([5, 6, 9, 6, 1, 5, 6], 2, PARAMS, RNG).token_ids == [9, 6]


def test_no_match_proposes_nothing():
    lookup = PromptLookup(min_ngram=2, max_ngram=3)
    draft = lookup.propose([1, 2, 3, 4, 5], 4, PARAMS, RNG)
    assert draft.token_ids == [] and draft.probs is None


def test_index_follows_a_growing_context_and_a_new_one():
    lookup = PromptLookup(min_ngram=2, max_ngram=2)
    context = [1, 2, 3, 4]
    assert lookup.propose(context, 2, PARAMS, RNG).token_ids == []
    context += [1, 2]
    assert lookup.propose(context, 2, PARAMS, RNG).token_ids == [3, 4]
    # An edited conversation of the same length: [1, 2] is now followed by [7, 4].
    assert lookup.propose([1, 2, 7, 4, 1, 2], 2, PARAMS, RNG).token_ids == [7, 4]
    # A different conversation: the old index must not leak into it.
    assert lookup.propose([9, 8, 1, 2], 2, PARAMS, RNG).token_ids == []


def test_a_conversation_left_for_another_comes_back_with_what_it_learned():
    from edgespec.drafters.copying import KEPT
    index = CopyIndex(min_ngram=2, max_ngram=4)
    a = [i % 50 for i in range(120)]
    index.follow(a)
    index.failed[(1, 2, 3, 4)] = (3, 9)  # (as if a copy after that key had failed)
    breaks = index.breaks
    b = [100 + i for i in range(80)]
    index.follow(b)  # a side request: its own index, nothing of A's
    assert index.tokens == b and index.failed == {} and index.breaks is not breaks
    assert index.find(4) is None
    index.follow(a + [1, 2])  # back to A, continued: what A learned is back
    assert index.tokens == a + [1, 2] and index.failed == {(1, 2, 3, 4): (3, 9)}
    assert index.breaks is breaks and index.find(2).tokens == [3, 4]
    index.follow(b + [7])  # and B's, too
    assert index.tokens == b + [7] and index.failed == {}
    for n in range(KEPT + 1):  # only the last KEPT conversations are kept
        index.follow([300 + 100 * n + i for i in range(70)])
    index.follow(a + [1, 2, 3])
    assert index.failed == {}  # A's was the oldest: it starts over


class _CountingTable(dict):
    """An n-gram table that counts every entry written into it."""

    def __init__(self, counter, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._counter = counter
        counter.writes += len(self)  # a table built already filled did that work too

    def __setitem__(self, key, value):
        self._counter.writes += 1
        super().__setitem__(key, value)

    def setdefault(self, key, default=None):
        self._counter.writes += 1
        return super().setdefault(key, default)

    def update(self, *args, **kwargs):
        other = dict(*args, **kwargs)
        self._counter.writes += len(other)
        super().update(other)


class _CountingIndex(dict):
    """The per-n dict of tables; a table put into it (or replaced) is counted too."""

    def __init__(self, counter, tables):
        super().__init__({n: _CountingTable(counter, t) for n, t in tables.items()})
        self._counter = counter

    def __setitem__(self, n, table):
        super().__setitem__(n, _CountingTable(self._counter, table))


class CountingIndex(CopyIndex):
    """A CopyIndex whose n-gram index counts its insertions, however it is rebuilt:
    assigning ``self._index`` (as ``reset`` does) installs counting tables too."""

    def __init__(self, **kwargs):
        self.writes = 0
        super().__init__(**kwargs)

    @property
    def _index(self):
        return self.__dict__["_index"]

    @_index.setter
    def _index(self, tables):
        self.__dict__["_index"] = _CountingIndex(self, tables)


class CountingLookup(PromptLookup):
    """PromptLookup over a :class:`CountingIndex`."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.copies = CountingIndex(min_ngram=self.min_ngram, max_ngram=self.max_ngram)

    @property
    def writes(self) -> int:
        return self.copies.writes


def test_rounds_on_a_long_context_stay_cheap():
    """Each round only indexes the new tokens: the n-gram insertions of a round are
    bounded by the tokens it adds, not by the context's length (a rescan of the
    whole context would insert ~len(context) entries per n-gram size every round)."""
    rng = np.random.default_rng(1)
    lookup = CountingLookup()
    sizes = lookup.max_ngram - lookup.min_ngram + 1
    context = rng.integers(0, 1000, 20_000).tolist()
    lookup.propose(context, 4, PARAMS, RNG)  # indexes the prompt once
    # The counter sees the indexing (else the bound below would hold vacuously).
    assert lookup.writes >= len(context) - lookup.max_ngram
    for _ in range(200):
        new = rng.integers(0, 1000, int(rng.integers(1, 6))).tolist()  # accepted drafts + 1
        context.extend(new)
        before = lookup.writes
        lookup.propose(context, 4, PARAMS, RNG)
        assert lookup.writes - before <= len(new) * sizes, (len(context), lookup.writes - before)
    # Proposing again on an unchanged context indexes nothing.
    before = lookup.writes
    lookup.propose(context, 4, PARAMS, RNG)
    assert lookup.writes == before
    # The cheap rounds did index the new tokens: an n-gram (of tokens unseen before)
    # added during the rounds is found, and what followed it is proposed.
    unseen = list(range(5000, 5010))
    for token in unseen:
        context.append(token)
        lookup.propose(context, 4, PARAMS, RNG)
    context += unseen[3:5]
    assert lookup.propose(context, 4, PARAMS, RNG).token_ids == unseen[5:9]
