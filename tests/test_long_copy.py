"""Long confident copies: matches measured far back, drafts up to 64 tokens, a memory of
where copies broke off, and auto mode drafting long only where long passes are cheap.

Deterministic: token lists for the drafters, toy models on a simulated clock for auto
mode (each pass advances the clock by what a pass of its size costs).
"""

import numpy as np
import pytest

from edgespec import Engine, PromptLookup, SamplingParams
from edgespec.backends.toy import SimClock, ToyBackend
from edgespec.core.config import DEFAULT_CONFIG
from edgespec.planner.costs import CostModel

LONG_SIZES = DEFAULT_CONFIG.long_sizes
from edgespec.drafters.copying import CopyIndex, match_bucket
from edgespec.drafters.suffix import SuffixDrafter
from edgespec.planner import AdaptivePlanner, AutoPlanners, PlannerConfig

GREEDY = SamplingParams(temperature=0)
RNG = np.random.default_rng(0)
STEP = 0.03  # seconds of a one-token target pass on the simulated clock

SOURCE = list(range(100, 160))  # a passage of 60 distinct tokens: "the file"


def test_a_match_is_measured_as_far_back_as_it_reaches():
    index = CopyIndex(min_ngram=2, max_ngram=4, max_match=64)
    # The context ends with the source's first 20 tokens: a 20-token match, though the
    # index keys on 4-grams at most.
    index.follow(SOURCE + [1, 2] + SOURCE[:20])
    copy = index.find(64)
    assert copy.match == 20 and copy.tokens == SOURCE[20:] + [1, 2] + SOURCE[:20]
    assert match_bucket(copy.match) == "match16" and match_bucket(2) == "match2"
    assert index.find(8).tokens == SOURCE[20:28]  # as far as the draft may go


def test_a_copy_in_progress_beats_a_more_recent_coincidence():
    # The text copies SOURCE; its last two tokens also occur later on (followed by 7),
    # in a shorter match. The copy in progress, the longer match, is followed.
    index = CopyIndex(min_ngram=2, max_ngram=2)
    context = SOURCE + [SOURCE[8], SOURCE[9], 7] + SOURCE[:6]
    index.follow(context)
    assert index.find(4).tokens == SOURCE[6:10]
    index.follow(context + SOURCE[6:10])  # the text went on as copied
    copy = index.find(5)
    assert copy.match == 10 and copy.tokens == SOURCE[10:15]


def test_the_next_copy_after_a_key_follows_what_the_text_did_there_last_time():
    """A copy that failed (5 tokens held, then the target wrote 999): the next copy
    after the same tokens follows the text's own last version, 999 included."""
    lookup = PromptLookup(min_ngram=2, max_ngram=8)
    context = SOURCE + [1, 2] + SOURCE[:12]
    assert lookup.propose(context, 16, GREEDY, RNG).token_ids == SOURCE[12:28]
    context += SOURCE[12:17] + [999, 3, 4] + SOURCE[:12]
    assert lookup.propose(context, 16, GREEDY, RNG).token_ids == \
        SOURCE[12:17] + [999, 3, 4] + SOURCE[:8]


def test_a_copys_length_follows_what_was_accepted_last_time():
    """Where a copy after a key failed, the next copy after that key stops just before
    the token that failed, if it would draft the same one (llama.cpp's ngram-map-k
    drafts what was accepted last time); once the text goes through it, it runs on."""
    index = CopyIndex(min_ngram=2, max_ngram=8)
    context = SOURCE + [1, 2] + SOURCE[4:12]  # a reply copying the file from its 5th token
    index.follow(context)
    assert index.find(16).tokens == SOURCE[12:28]
    context += SOURCE[12:16] + [999, 5, 6]  # 4 tokens held, then the target wrote 999
    index.follow(context)
    key = tuple(SOURCE[4:12])
    assert index.failed[key] == (4, SOURCE[16])
    # The reply starts over and copies the file from its first token: the copy in
    # progress (the longest match: 12 tokens) reaches the same key.
    context += SOURCE[:4]
    index.follow(context)
    assert index.find(8).tokens == SOURCE[4:12]
    context += SOURCE[4:12]
    index.follow(context)
    copy = index.find(16)
    assert copy.match == 12 and copy.tokens == SOURCE[12:16]  # cut before SOURCE[16]
    # This time the target goes on as the file does: the failure is forgotten.
    context += SOURCE[12:17]
    index.follow(context)
    assert key not in index.failed and index.find(16).tokens == SOURCE[17:33]


def test_a_failing_copy_is_abandoned_within_one_round():
    """A reply that looks like a copy but is not: once the first draft from the source
    is rejected at its first token, no later draft copies that token again."""
    target_text = [5, 6, 7, 8] * 10  # what the target writes instead
    lookup = PromptLookup(min_ngram=2, max_ngram=8)
    context = SOURCE + [1, 2] + SOURCE[:30]
    first = lookup.propose(context, 64, GREEDY, RNG)
    assert first.token_ids[:3] == SOURCE[30:33] and first.bucket == "match16"
    for token in target_text:
        context.append(token)
        assert SOURCE[30] not in lookup.propose(context, 64, GREEDY, RNG).token_ids
    assert lookup.copies.failed[tuple(SOURCE[22:30])] == (0, SOURCE[30])


def test_the_suffix_drafter_copies_long_matches_with_the_same_memory():
    suffix = SuffixDrafter(min_ngram=2, max_ngram=8)
    context = SOURCE + [1, 2] + SOURCE[4:12]
    first = suffix.propose(context, 16, GREEDY, RNG)
    assert first.token_ids == SOURCE[12:28] and first.bucket == "match8"
    context += SOURCE[12:16] + [999, 5, 6] + SOURCE[:4]
    suffix.propose(context, 8, GREEDY, RNG)
    context += SOURCE[4:12]
    assert suffix.propose(context, 16, GREEDY, RNG).token_ids == SOURCE[12:16]


# -- auto mode on a toy whose replies copy a passage with an edit every 12 tokens ----------


def fibonacci_target(clock: SimClock, token_seconds: float, vocab: int = 64) -> ToyBackend:
    """A toy whose greedy text is a Fibonacci walk mod ``vocab`` (each token the sum of
    the two before it): every pair of tokens has one continuation."""
    table = np.full((vocab, vocab, vocab), -6.0)
    for prev in range(vocab):
        for last in range(vocab):
            table[prev, last, (prev + last) % vocab] = 6.0
    return ToyBackend(table, clock=clock, step_seconds=STEP, token_seconds=token_seconds)


def walk(start: tuple[int, int], n: int, vocab: int = 64) -> list[int]:
    out = list(start)
    while len(out) < n:
        out.append((out[-2] + out[-1]) % vocab)
    return out


def copy_prompt() -> list[int]:
    """The walk's first 90 tokens with every 12th replaced (the 'file' the reply
    returns with edits), then the walk's first tokens: the reply copies, breaking off at
    each edit and picking the copy up again two tokens later."""
    source = walk((1, 1), 90)
    for i in range(11, len(source), 12):
        source[i] = 63 if source[i] != 63 else 62
    return source + [60, 61] + walk((1, 1), 4)


def test_auto_drafts_long_where_long_passes_are_cheap_and_short_where_they_are_not():
    """The same copying reply, on a machine where a pass over n tokens costs about one
    step (flat) and on one where each further token adds 0.7 of a step (linear), beside
    prompt lookup drafting a fixed 4 and 16 tokens on the same machine."""
    longest, speed = {}, {}
    for grows in (0.01, 0.7):
        prior = {"v": {str(n): 1 + grows * (n - 1) for n in (2, 3, 4, 5, 8, 9)}, "c": {}}
        for k in ("auto", 4, 16):
            clock = SimClock()
            planner = AdaptivePlanner([PromptLookup()], CostModel(prior), PlannerConfig()) \
                if k == "auto" else None
            engine = Engine(fibonacci_target(clock, grows * STEP), PromptLookup(), num_draft=k,
                            planner=planner, clock=clock)
            prompt = copy_prompt()
            spec = engine.generate(prompt, GREEDY, max_tokens=80)
            plain = engine.generate(prompt, GREEDY, max_tokens=80, speculative=False)
            assert spec.token_ids == plain.token_ids
            speed[grows, k] = spec.stats.decode_time_s / plain.stats.decode_time_s  # (lower: faster)
            if k == "auto":
                longest[grows] = len(spec.stats.drafted_per_position)  # positions ever drafted
                steps = plain.stats.decode_time_s / STEP  # plain decoding's, a step each
                budget = planner.config.explore_start + planner.config.explore_rate * 80
    # Flat: auto drafts long and beats short fixed drafts. Linear: long fixed drafts lose
    # to plain decoding; auto does not, beyond what its exploration budget may spend.
    assert speed[0.01, "auto"] < speed[0.01, 4] < 1
    assert speed[0.7, 16] > 1
    assert speed[0.7, "auto"] * steps <= steps + budget
    # Copies break every 12 tokens. Where a longer pass costs next to nothing, drafts run
    # past that (the whole rest of the source is worth verifying); where each token costs
    # most of a step, they stop short of it, if they are made at all.
    assert longest[0.01] > 12 >= longest[0.7]
    assert longest[0.01] >= 2 * max(longest[0.7], 1)


def test_auto_mode_times_the_long_passes_it_has_not_measured_and_keeps_the_cache():
    """The calibration times passes of up to 9 tokens; what 16, 32 and 64 cost is timed
    where auto mode's planner is made (as a round's pass is, every row verified, after
    what the engine's cache holds), and the cache holds the conversation again after."""
    grows, prompt = 0.2, walk((3, 5), 300)
    clock = SimClock()
    target = fibonacci_target(clock, grows * STEP)
    prior = {"v": {str(n): 1 + grows * (n - 1) for n in (2, 3, 4, 5, 8, 9)}, "c": {}}
    engine = Engine(target, clock=clock)
    plain = engine.generate(prompt, GREEDY, max_tokens=8, speculative=False)  # cached now
    planners = AutoPlanners(prior=prior)
    planner = planners.planner(None, "auto", target=engine.target_cache, clock=clock)
    assert set(LONG_SIZES) <= set(planner.cost.measured_sizes())
    assert planner.timing_wanted() == ()
    assert planner.cost.v(64) == pytest.approx(1 + grows * 63)
    assert planners.planner(None, "auto", target=engine.target_cache, clock=clock) is planner
    engine.configure(None, "auto", planner)
    auto = engine.generate(prompt, GREEDY, max_tokens=8)
    assert auto.stats.prompt_eval_tokens == 1  # the prompt was still in the cache
    assert auto.token_ids == plain.token_ids


def test_the_long_passes_are_timed_once_per_machine(tmp_path, monkeypatch):
    """A run's timings become the next run's prior (what closing the planners saves):
    the next engine on the same machine times nothing, and calibrates nothing."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    clock = SimClock()
    first = Engine(fibonacci_target(clock, 0.2 * STEP), None, num_draft="auto",
                   planners=AutoPlanners(), clock=clock)
    assert set(LONG_SIZES) <= set(first.planner.cost.measured_sizes())
    first.generate(walk((3, 5), 60), GREEDY, max_tokens=4)
    first.close()
    target = fibonacci_target(clock, 0.2 * STEP)
    second = Engine(target, None, num_draft="auto", planners=AutoPlanners(), clock=clock)
    assert second.planner.timing_wanted() == ()
    assert target.forward_calls == 0
