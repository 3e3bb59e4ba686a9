
import numpy as np

from edgespec import PromptLookup, SamplingParams

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
    # A different conversation: the old index must not leak into it.
    assert lookup.propose([9, 8, 1, 2], 2, PARAMS, RNG).token_ids == []


def test_rounds_on_a_long_context_stay_cheap():
    """Each round only indexes the new tokens, so cost does not grow with length."""
    rng = np.random.default_rng(1)
    lookup = PromptLookup()
    context = rng.integers(0, 1000, 20_000).tolist()
    lookup.propose(context, 4, PARAMS, RNG)  # indexes the prompt once
    ops_before = sum(len(t) for t in lookup._index.values())
    for _ in range(200):
        context.append(int(rng.integers(0, 1000)))
        lookup.propose(context, 4, PARAMS, RNG)
    # 200 new tokens add at most 200 entries per n-gram size, never a rescan.
    added = sum(len(t) for t in lookup._index.values()) - ops_before
    assert added <= 200 * (lookup.max_ngram - lookup.min_ngram + 1)
