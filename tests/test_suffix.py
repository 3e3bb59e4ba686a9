"""The suffix drafter: continuation counts over the context and earlier contexts."""

import numpy as np
import pytest

from edgespec import Engine, SamplingParams
from edgespec.backends.toy import ToyBackend
from edgespec.drafters import DraftModel, PromptLookup
from edgespec.drafters.suffix import SuffixDrafter
from edgespec.planner import auto_drafters
from exactness import SIGNIFICANCE, chi_square_pvalue, exact_distribution, sample_continuations

GREEDY = SamplingParams(temperature=0)
RNG = np.random.default_rng(0)


def draft(drafter, context, k=8):
    return drafter.propose(context, k, GREEDY, RNG)


def test_it_continues_what_followed_before_as_far_as_it_is_sure_and_copies_long_matches():
    text = [5, 6, 7, 8, 9, 10, 11, 12]
    continued = text[3:] + [1, 2, 5]
    # A short match: the counts draft it, classed by how sure they are.
    proposal = draft(SuffixDrafter(), text + [1, 2] + text[:3])
    assert proposal.token_ids == continued and proposal.probs is None
    assert proposal.bucket.startswith("sure")
    # A match further back than the counts' n-grams: a copy, classed by its length.
    long = list(range(20, 40))
    proposal = draft(SuffixDrafter(), long + [1, 2] + long[:12])
    assert proposal.token_ids == long[12:] and proposal.bucket == "match8"
    # Only an earlier conversation holds it: the counts draft it.
    drafter = SuffixDrafter()
    drafter.prefill(list(range(200, 220)) + text + [1, 2] + text)
    proposal = draft(drafter, list(range(100, 140)) + text[:3])
    assert drafter.remembered_tokens == 38
    assert proposal.token_ids == continued and proposal.bucket.startswith("sure")


def test_the_most_frequent_continuation_wins_and_unsure_ones_are_not_drafted():
    context = [1, 2, 3, 9] * 3 + [1, 2, 4, 9] + [1, 2]
    likely = draft(SuffixDrafter(min_confidence=0.3), context, k=1)
    assert likely.token_ids == [3] and likely.bucket.startswith("likely")  # [9, 1, 2]: 3 twice, 4 once
    assert draft(SuffixDrafter(min_confidence=0.8), context, k=1).token_ids == []
    # The draft stops where the product of frequencies falls below the threshold:
    # after [7, 8] always 1, after [7, 8, 1] 2 or 3 alike (and no longer match decides).
    forked = [7, 8, 1, 2, 7, 8, 1, 3, 9, 7, 8]
    assert draft(SuffixDrafter(min_confidence=0.6), forked, k=4).token_ids == [1]
    assert len(draft(SuffixDrafter(min_confidence=0.4), forked, k=4)) == 4


def test_of_equally_frequent_continuations_the_latest_wins():
    """Code edited turn after turn: where two versions were seen as often, the draft
    follows the one seen last (the latest version), whichever came first."""
    for first, then in ((3, 4), (4, 3)):
        context = [1, 2, first, 9, 1, 2, then, 9, 1, 2]
        assert draft(SuffixDrafter(min_confidence=0.0), context, k=1).token_ids == [then]
    # Counted again, a continuation becomes the latest: 3, 4, 3, 4 (two each) drafts 4.
    # (Two-token keys only: a longer match would say what followed this very sequence.)
    for first, then in ((3, 4), (4, 3)):
        context = [1, 2, first, 9, 1, 2, then, 9] * 2 + [1, 2]
        assert draft(SuffixDrafter(min_confidence=0.0, max_ngram=2), context, k=1).token_ids == [then]


def test_it_remembers_an_earlier_conversation():
    drafter = SuffixDrafter()
    earlier = list(range(10, 60))  # a reply in another conversation
    drafter.prefill(earlier)
    now = list(range(100, 150)) + [30, 31, 32]  # a new conversation quotes it
    assert draft(drafter, now, k=5).token_ids == [33, 34, 35, 36, 37]
    assert drafter.remembered_tokens == len(earlier)
    drafter.forget()
    assert draft(SuffixDrafter(), now, k=5).token_ids == []  # (a fresh one has nothing)
    assert drafter.remembered_tokens == 0 and draft(drafter, now, k=5).token_ids == []


def test_a_regenerated_reply_is_taken_back_not_remembered():
    drafter = SuffixDrafter()
    drafter.prefill([1, 2, 3, 4, 5, 6, 7])
    drafter.prefill([1, 2, 3, 4, 8])  # the same conversation, the last turn redone
    assert drafter.remembered_tokens == 0
    assert draft(drafter, [1, 2, 3, 4, 8, 1, 2, 3, 4], k=1).token_ids == [8]  # not 5


def test_memory_is_bounded_in_tokens_entries_and_work():
    limit, max_ngram = 1000, 6
    drafter = SuffixDrafter(memory_tokens=limit, max_ngram=max_ngram)
    rng = np.random.default_rng(1)
    fed = 0
    for _ in range(60):  # 60 different conversations of 100 tokens: 6x the memory
        context = [int(t) for t in rng.integers(0, 5000, 100)]
        drafter.prefill(context)
        fed += len(context)
    assert drafter.remembered_tokens <= limit
    live = 100
    assert drafter.counts.size() <= max_ngram * (limit + live)
    # Each token is counted once and taken back at most once, max_ngram entries each.
    assert drafter.counts.operations <= 2 * max_ngram * fed


@pytest.mark.parametrize("num_draft", [2, 5])
def test_greedy_output_is_unchanged(num_draft):
    target = ToyBackend.random(12, seed=5, scale=2.0)
    engine = Engine(target, SuffixDrafter(), num_draft=num_draft)
    prompt = [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    plain = engine.generate(prompt, GREEDY, max_tokens=60, speculative=False)
    spec = engine.generate(prompt, GREEDY, max_tokens=60)
    assert spec.token_ids == plain.token_ids and spec.stats.drafted > 0


@pytest.mark.slow
def test_sampled_output_is_distributed_as_the_target():
    """Chi-square at significance 0.001 (fixed seeds), 20,000 three-token samples."""
    target = ToyBackend.random(8, seed=1, scale=1.5)
    prompt = [0, 1, 2, 0, 1]
    params = SamplingParams(temperature=1.0)
    engine = Engine(target, SuffixDrafter(min_ngram=1, min_confidence=0.0), num_draft=3)
    expected = exact_distribution(target, prompt, params, 3)
    counts, totals = sample_continuations(engine, prompt, params, 3, 20_000, seed=12)
    assert chi_square_pvalue(counts, expected) > SIGNIFICANCE
    assert 0 < totals.accepted < totals.drafted


def test_chat_reset_keeps_the_memory_unless_asked():
    from edgespec.session import ChatSession
    target = ToyBackend.random(12, seed=5, scale=2.0)
    suffix = SuffixDrafter()
    session = ChatSession(Engine(target, suffix, num_draft=2))
    suffix.prefill(list(range(40)))
    suffix.prefill(list(range(50, 100)))  # another conversation: the first is remembered
    session.reset()
    assert suffix.remembered_tokens == 40
    session.reset(forget_memory=True)
    assert suffix.remembered_tokens == 0


def test_in_auto_mode_the_suffix_drafter_takes_prompt_lookups_place():
    """-d suffix with --num-draft auto is auto mode over the suffix drafter: it
    drafts from the text as lookup does, so lookup asked first would leave it only
    the rounds where lookup found nothing. A draft model is asked after lookup."""
    suffix, lookup = SuffixDrafter(), PromptLookup(max_ngram=8)
    assert auto_drafters(suffix, lookup) == [suffix]
    assert auto_drafters(None, lookup) == [lookup]
    model = DraftModel(ToyBackend.random(8, seed=1))
    assert auto_drafters(model, lookup) == [lookup, model]
