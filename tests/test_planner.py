"""Auto mode: the planner's choices, its cost handling, greedy equality and exactness.

Toy models run on a simulated clock (each pass advances it by what a pass of
that size costs), so the planner sees realistic, deterministic costs. Tests
that depend on how much exploration the policy does pin a PlannerConfig.
"""

import json

import numpy as np
import pytest

from edgespec import DraftModel, Engine, PromptLookup, SamplingParams
from edgespec.backends.toy import SimClock, ToyBackend
from edgespec.planner.factory import AutoPlanners, auto_planner, costs_path
from edgespec.planner.calibration import calibration_path, save_calibration
from edgespec.planner.costs import CostModel
from edgespec.core.draft import COPY, MODEL, Draft, DrafterBase
from edgespec.planner import DraftReport, Proposal, RoundResult
from edgespec.planner import AcceptanceTracker, AdaptivePlanner, PlannerConfig
from exactness import SIGNIFICANCE, chi_square_pvalue, exact_distribution, sample_continuations

GREEDY = SamplingParams(temperature=0)
STEP = 0.03  # seconds of a one-token target pass on the simulated clock


def timed_pair(*, batch_grows: float, drafter_cost: float, noise: float, clock: SimClock,
               target_seed: int = 5, scale: float = 2.0, vocab: int = 12):
    """A toy target whose n-token pass costs (1 + batch_grows·(n-1)) steps, and a
    draft model (its logits plus ``noise``) whose step costs ``drafter_cost`` steps."""
    target = ToyBackend.random(vocab, seed=target_seed, scale=scale, clock=clock,
                               step_seconds=STEP, token_seconds=batch_grows * STEP)
    draft = target.perturbed(noise=noise, seed=6, clock=clock, step_seconds=drafter_cost * STEP,
                             token_seconds=batch_grows * drafter_cost * STEP)
    return target, DraftModel(draft)


def true_prior(batch_grows: float, drafter_cost: float, name: str = "toy-draft") -> dict:
    return {"v": {str(n): 1 + batch_grows * (n - 1) for n in (2, 3, 5, 9)}, "c": {name: drafter_cost}}


def budget_bound(config: PlannerConfig, tokens: int) -> float:
    """Plain steps auto mode may lose over ``tokens`` tokens: its exploration budget
    (the start, what the tokens earn) and one try that overdraws it by the worst a
    try may lose (a probe is cut to what the budget holds: at most its cap)."""
    return config.explore_start + config.explore_rate * tokens + config.explore_cap


def auto_engine(target, drafter, clock, prior=None, config=None, *, lookup=True):
    drafters = [PromptLookup(max_ngram=8), drafter] if lookup else [drafter]
    planner = AdaptivePlanner(drafters, CostModel(prior), config)
    return Engine(target, drafter, num_draft="auto", planner=planner, clock=clock)


def test_expected_tokens_follow_the_acceptance_rates():
    tracker = AcceptanceTracker(PlannerConfig(), prior=0.5)
    assert tracker.expected_tokens(0) == 1.0
    assert tracker.expected_tokens(2) == pytest.approx(1 + 0.5 + 0.25)
    for _ in range(200):
        tracker.update(drafted=3, accepted=3)
    assert all(a > 0.9 for a in tracker.alpha) and tracker.expected_tokens(3) > 3.5
    for _ in range(200):
        tracker.update(drafted=3, accepted=0)  # only position 0 was tested
    assert tracker.alpha[0] < 0.1 and tracker.alpha[1] > 0.8  # untested: still high


def test_a_drafter_that_stops_early_is_expected_to_yield_less():
    config = PlannerConfig()
    steady, hesitant = AcceptanceTracker(config, prior=0.9), AcceptanceTracker(config, prior=0.9)
    for _ in range(50):
        steady.update(drafted=2, accepted=2)
        hesitant.update(drafted=0, accepted=0, stopped=True)  # not confident: drafted nothing
        hesitant.update(drafted=2, accepted=2)
    v = CostModel(true_prior(0.3, 0.3)).v
    assert hesitant.offer.estimates(1)[0] < 0.7 < steady.offer.estimates(1)[0]
    assert hesitant.expected_speeds(2, 0.3, v)[-1] < steady.expected_speeds(2, 0.3, v)[-1]


def test_a_copy_that_often_fails_to_start_is_not_expected_to_go_on_long():
    """Before any evidence past the first position, the later positions' α follows
    the first's: where lookup drafts mostly fail at once (chat at T > 0), a long
    draft on the strength of a fixed continuation prior would lose every round."""
    config = PlannerConfig()
    v = CostModel(true_prior(0.25, 0.0)).v
    weak, strong = (AcceptanceTracker(config, prior=0.5, later_lift=config.continuation_lift)
                    for _ in range(2))
    for _ in range(12):
        weak.update(drafted=3, accepted=0)
        strong.update(drafted=1, accepted=1)  # evidence at the first position only
    weak_alpha, strong_alpha = weak._accept(4, 0.0), strong._accept(4, 0.0)
    assert weak_alpha[0] < 0.3 and strong_alpha[0] > 0.8
    # Neither has evidence past the first position: the later α follow the first's.
    assert max(weak_alpha[1:]) < 0.5 < min(strong_alpha[1:])
    assert min(strong_alpha[1:]) > strong_alpha[0]  # lifted toward 1
    assert max(weak.expected_speeds(4, 0.0, v)) < 1.0 < max(strong.expected_speeds(4, 0.0, v))


def test_a_copy_that_went_on_so_far_is_expected_to_go_on_further():
    """Lookup drafts: positions after the first share one rate, so a copy that was
    always accepted as far as it was verified (k = 3) is expected to go on past that,
    and a longer draft pays, instead of untested positions staying at their prior."""
    config = PlannerConfig()
    tracker = AcceptanceTracker(config, prior=0.5, later_lift=config.continuation_lift)
    for _ in range(40):
        tracker.update(drafted=3, accepted=0)
        tracker.update(drafted=3, accepted=3)
    alpha = tracker._accept(8, 0.0)
    assert alpha[0] == pytest.approx(0.5, abs=0.05)
    later_prior = 0.5 + 0.5 * config.continuation_lift
    assert min(alpha[1:]) > 0.95 > later_prior  # positions 4..8 were never tested
    v = CostModel(true_prior(0.25, 0.0)).v
    speeds = tracker.expected_speeds(8, 0.0, v)
    assert int(np.argmax(speeds)) + 1 == 8


def test_a_copy_in_progress_is_verified_far_and_a_coincidence_not_at_all():
    """Lookup drafts are judged by their kind once proposed (here: match length)."""
    config = PlannerConfig(optimism=0.0)
    lookup = PromptLookup()
    planner = AdaptivePlanner([lookup], CostModel(), config)
    for n in (1, 1, 1, 5, 9):  # this run's passes: plain steps of 1 s, v(n) = 1 + 0.3 (n - 1)
        planner.observe(RoundResult(None, None, 0, 0, n, 1 + 0.3 * (n - 1), np.ones(1)))
    for _ in range(100):
        planner.tracker("lookup:match8").update(8, 8)
        planner.tracker("lookup:match2").update(4, 0)

    def verified(bucket):
        proposal = planner.plan([0], 8)
        assert proposal is not None and proposal.drafter is lookup  # asking costs nothing
        report = DraftReport(proposal, Draft(list(range(8)), None, bucket), 0, 0.0, 0.0)
        result = planner.review(report)
        planner.observe(RoundResult(None, None, 0, 0, 1, 1.0, np.ones(1), (report,)))  # (not verified)
        return 0 if result is None else result.num_draft

    assert verified("match8") >= 6
    assert verified("match2") == 0


def test_no_planner_verifies_a_draft_shorter_than_draft_min():
    """--draft-min: a fixed k and auto mode alike leave a shorter draft unverified."""
    from edgespec.core.planner import FixedPlanner
    lookup = PromptLookup()
    auto = AdaptivePlanner([lookup], CostModel(), PlannerConfig(optimism=0.0))
    for n in (1, 1, 1, 2, 5, 9):  # cheap passes: plain steps of 1 s, v(n) = 1 + 0.05 (n - 1)
        auto.observe(RoundResult(None, None, 0, 0, n, 1 + 0.05 * (n - 1), np.ones(1)))
    for _ in range(100):  # (a copy of this kind is always accepted: worth verifying)
        auto.tracker("lookup:match8").update(8, 8)

    def verified(planner, n):
        report = DraftReport(Proposal(lookup, 8), Draft(list(range(n)), None, "match8"), 0, 0.0, 0.0)
        result = planner.review(report)
        return 0 if result is None else result.num_draft

    assert verified(FixedPlanner(lookup, 8), 2) == 2 and verified(auto, 2) == 2
    fixed, auto.min_draft = FixedPlanner(lookup, 8, min_draft=3), 3
    assert verified(fixed, 2) == 0 and verified(fixed, 3) == 3
    assert verified(auto, 2) == 0 and verified(auto, 8) >= 3


@pytest.mark.parametrize("batch_grows, drafter_cost", [(0.05, 0.1), (1.0, 0.9)],
                         ids=["speculation-pays", "speculation-loses"])
def test_auto_greedy_equals_plain_and_speculates_only_where_it_pays(batch_grows, drafter_cost):
    clock = SimClock()
    target, drafter = timed_pair(batch_grows=batch_grows, drafter_cost=drafter_cost, noise=0.7,
                                 clock=clock)
    engine = auto_engine(target, drafter, clock, true_prior(batch_grows, drafter_cost))
    prompt = [0, 1, 2, 3, 0, 1]
    passes = target.forward_calls
    auto = engine.generate(prompt, GREEDY, max_tokens=120)
    passes = target.forward_calls - passes
    plain = engine.generate(prompt, GREEDY, max_tokens=120, speculative=False)
    assert auto.token_ids == plain.token_ids
    s = auto.stats
    assert s.drafter == "auto(lookup+toy-draft)"
    # Every target pass after the prefill was a round the stats count (drafted or plain).
    assert passes == 1 + s.rounds + s.plain_steps
    if batch_grows < 0.5:
        assert s.rounds_per_drafter.get("toy-draft", 0) > 0
        assert s.tokens_per_second > 1.3 * plain.stats.tokens_per_second
    else:
        # A pass over n tokens costs n steps: nothing beats plain decoding, so only
        # probes may draft, and they lose no more than the exploration budget holds.
        assert s.rounds == s.probes
        assert auto.stats.decode_time_s <= plain.stats.decode_time_s + STEP * budget_bound(
            engine.planner.config, len(auto.token_ids))


def test_exploration_is_paid_from_a_budget_that_bounds_what_it_loses():
    """Sampled text from a toy model repeats only by coincidence, so prompt lookup's drafts
    are mostly rejected; with a pass over n tokens costing 1 + 0.6 (n - 1) steps, verifying
    them does not pay. A planner made very hopeful (low priors, but optimism 5: it would try
    nearly every draft) loses no more than its exploration budget allows: explore_start
    plus explore_rate per token, in plain steps."""
    n, params, grows = 400, SamplingParams(temperature=1.0, seed=3, invariant=False), 0.6
    # (Hopes on the planner's own rates: a copy's own chance to hold is not optimistic.)
    hopeful = dict(optimism=5.0, priors={}, copy_prior=0.1, continuation_lift=0.0, copy_holds=False)

    def steps_lost(config):
        clock = SimClock()
        target = ToyBackend.random(12, seed=5, scale=2.0, clock=clock, step_seconds=STEP,
                                   token_seconds=grows * STEP)
        planner = AdaptivePlanner([PromptLookup(max_ngram=8)], CostModel(true_prior(grows, 0.0)), config)
        engine = Engine(target, None, num_draft="auto", planner=planner, clock=clock)
        stats = engine.generate([0, 1, 2, 3, 0, 1], params, max_tokens=n).stats
        assert stats.generated_tokens == n and stats.probes > 5  # it tried
        return stats.decode_time_s / STEP - n  # a plain step costs exactly STEP here

    config = PlannerConfig(explore_start=2.0, explore_rate=0.02, **hopeful)
    lost = steps_lost(config)
    # One try may overdraw the budget by what it lost (at most v(9) - 1 = 4.8 steps).
    assert 0 < lost <= config.explore_start + config.explore_rate * n + grows * 8
    # Without the budget the same hopes cost far more.
    assert steps_lost(PlannerConfig(explore_start=1e9, explore_cap=1e9, **hopeful)) > 3 * lost


def test_exactness_with_auto_on():
    """Chi-square at significance 0.001, 20,000 samples of 3 tokens, fixed seed."""
    clock = SimClock()
    target, drafter = timed_pair(batch_grows=0.05, drafter_cost=0.1, noise=1.0, clock=clock,
                                 target_seed=1, scale=1.5, vocab=8)
    engine = auto_engine(target, drafter, clock, true_prior(0.05, 0.1))
    params = SamplingParams(temperature=1.0)
    prompt = [0, 1, 2, 0, 1]
    expected = exact_distribution(target, prompt, params, 3)
    counts, totals = sample_continuations(engine, prompt, params, 3, 20_000, seed=41)
    assert chi_square_pvalue(counts, expected) > SIGNIFICANCE
    # Both drafters took rounds.
    assert totals.rounds_per_drafter.get("lookup", 0) > 0
    assert totals.rounds_per_drafter.get("toy-draft", 0) > 0
    assert 0 < totals.accepted < totals.drafted


def test_a_poisoned_calibration_is_corrected_within_64_tokens(tmp_path, monkeypatch):
    """The cached costs say a 2-token pass costs 6 steps and a draft step 6 (v(2) = 6,
    c = 6); on this machine speculation pays. Auto speculates again within two retry
    intervals, and gains a good part of what a fixed k gains here."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    clock = SimClock()
    target, drafter = timed_pair(batch_grows=0.1, drafter_cost=0.1, noise=0.3, clock=clock,
                                 scale=4.0)
    save_calibration({"v": {"2": 6.0, "3": 6.0, "5": 6.0, "9": 6.0}, "c": {"toy-draft": 6.0}},
                     calibration_path(target, drafter.backend))
    engine = Engine(target, drafter, num_draft="auto", planner=auto_planner(target, drafter),
                    clock=clock)
    prompt = [0, 1, 2, 3]
    auto = engine.generate(prompt, GREEDY, max_tokens=200)
    plain = engine.generate(prompt, GREEDY, max_tokens=200, speculative=False)
    assert auto.token_ids == plain.token_ids
    first_draft = auto.from_draft.index(True)
    assert first_draft < 2 * engine.planner.config.retry_after
    # ... and keeps speculating: most tokens after that came in speculative rounds.
    assert auto.stats.rounds > auto.stats.plain_steps
    engine.configure(drafter, 4)
    fixed = engine.generate(prompt, GREEDY, max_tokens=200).stats.tokens_per_second
    base = plain.stats.tokens_per_second
    assert fixed > base and auto.stats.tokens_per_second > base + (fixed - base) / 3


def test_a_cost_file_claiming_speculation_is_free_costs_no_more_than_the_budget(tmp_path, monkeypatch):
    """Cached costs say v(n) = 1 and a draft step costs nothing; in truth a pass over n
    tokens costs n steps and the draft model is a poor guesser. What auto mode loses
    to plain decoding stays within its exploration budget."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    clock = SimClock()
    target, drafter = timed_pair(batch_grows=1.0, drafter_cost=0.5, noise=3.0, clock=clock)
    save_calibration({"v": {"2": 1.0, "3": 1.0, "5": 1.0, "9": 1.0}, "c": {"toy-draft": 0.0}},
                     calibration_path(target, drafter.backend))
    engine = Engine(target, drafter, num_draft="auto", planner=auto_planner(target, drafter),
                    clock=clock)
    prompt = [0, 1, 2, 3, 4, 5]
    auto = engine.generate(prompt, GREEDY, max_tokens=128)
    plain = engine.generate(prompt, GREEDY, max_tokens=128, speculative=False)
    assert auto.token_ids == plain.token_ids
    assert auto.stats.decode_time_s <= plain.stats.decode_time_s + STEP * budget_bound(
        engine.planner.config, len(auto.token_ids))


def test_auto_keeps_what_it_learned_across_generations():
    clock = SimClock()
    target, drafter = timed_pair(batch_grows=0.05, drafter_cost=0.1, noise=0.5, clock=clock)
    engine = Engine(target, drafter, num_draft="auto", clock=clock,
                    planners=AutoPlanners(prior=true_prior(0.05, 0.1)))
    planner = engine.planner
    engine.generate([0, 1, 2], GREEDY, max_tokens=40)
    trials = sum(planner.tracker("toy-draft").accept.trials)
    assert trials > 0
    engine.configure(drafter, "auto")  # same drafter, same mode: the evidence stays
    engine.generate([3, 4, 5], GREEDY, max_tokens=40)
    assert engine.planner is planner and sum(planner.tracker("toy-draft").accept.trials) > trials
    engine.configure(None, "auto")  # another drafter: start afresh
    assert engine.planner is not planner


class RepeatLast(DrafterBase):
    """A third kind of drafter, added by implementing the protocol's one method a base
    class does not give and listing it: proposes the last committed token again, k
    times (deterministic: q one-hot)."""

    name = "repeat"
    kind = COPY

    def propose(self, context, num_draft, params, rng, *, min_confidence=None) -> Draft:
        return Draft([int(context[-1])] * num_draft)


class RepeatModel(RepeatLast):
    """The same drafts, reported as a draft model's (an offer rate, a confidence stop)."""

    name = "toy-draft"
    kind = MODEL


def test_a_third_drafter_needs_only_the_protocol_and_a_place_in_the_list():
    clock = SimClock()
    table = np.full((6, 6, 6), -4.0)
    for prev in range(6):
        for last in range(6):
            table[prev, last, last] = 4.0  # the target mostly repeats itself
    target = ToyBackend(table, clock=clock, step_seconds=STEP, token_seconds=0.1 * STEP)
    planner = AdaptivePlanner([PromptLookup(), RepeatLast()], CostModel(true_prior(0.1, 0.0, "repeat")))
    engine = Engine(target, None, num_draft="auto", planner=planner, clock=clock)
    auto = engine.generate([1, 2, 3], GREEDY, max_tokens=60)
    plain = engine.generate([1, 2, 3], GREEDY, max_tokens=60, speculative=False)
    assert auto.token_ids == plain.token_ids
    assert auto.stats.drafter == "auto(lookup+repeat)"
    # The third drafter was asked and did the work: most of the reply came from its
    # accepted drafts (lookup finds nothing to copy in a prompt of three tokens at first).
    assert auto.stats.rounds_per_drafter.get("repeat", 0) > 0
    assert auto.stats.accepted > auto.stats.generated_tokens / 2


def test_low_confidence_stops_the_draft_early():
    target = ToyBackend.random(12, seed=5, scale=0.2)  # flat distributions: low confidence
    rng = np.random.default_rng(0)
    drafter = DraftModel(target.perturbed(noise=0.0, seed=6), min_confidence=0.5)
    assert drafter.propose([0, 1], 4, GREEDY, rng).token_ids == []
    confident = DraftModel(ToyBackend.random(12, seed=5, scale=20.0), min_confidence=0.5)
    assert len(confident.propose([0, 1], 4, GREEDY, rng).token_ids) == 4


class CountingDraftModel(DraftModel):
    """A real draft model that counts how often the engine asks it for a draft."""

    calls = 0

    def propose(self, *args, **kwargs):
        self.calls += 1
        return super().propose(*args, **kwargs)


def test_auto_stops_asking_a_drafter_that_is_never_confident():
    """A draft model that is never sure is asked far less often than one that is
    (with the stop fixed: where a learned stop settles is the next test's)."""
    config = PlannerConfig(draft_p_min=0.5, learn_stop=False)

    def calls_of(sure: bool) -> float:
        clock = SimClock()
        target = ToyBackend.random(12, seed=5, scale=20.0, clock=clock, step_seconds=STEP,
                                   token_seconds=0.3 * STEP)  # peaked: the target is sure
        timing = dict(clock=clock, step_seconds=0.3 * STEP)
        backend = target.perturbed(noise=0.5, seed=6, **timing) if sure else \
            ToyBackend.random(12, seed=6, scale=0.2, name="toy-draft", **timing)  # flat: unsure
        draft = CountingDraftModel(backend, min_confidence=config.draft_p_min)
        # The model alone: no lookup rounds in between.
        engine = auto_engine(target, draft, clock, true_prior(0.3, 0.3), config, lookup=False)
        auto = engine.generate([0, 1, 2, 3], GREEDY, max_tokens=200)
        assert auto.token_ids == engine.generate([0, 1, 2, 3], GREEDY, max_tokens=200,
                                                 speculative=False).token_ids
        if not sure:
            assert auto.stats.rounds == 0  # it never drafted a token
            offer = engine.planner.tracker("toy-draft").offer
            assert offer.trials[0] > 0 and offer.hits[0] == 0  # every try was a stop, and counted
        return draft.calls / (auto.stats.rounds + auto.stats.plain_steps)  # asked per pass

    unsure, sure = calls_of(False), calls_of(True)
    assert 0 < unsure and 3 * unsure < sure


def test_the_targets_own_confidence_is_the_prior_of_the_draft_models_offers():
    config = PlannerConfig(optimism=0.0)
    drafter = DraftModel(ToyBackend.random(4, seed=0, name="toy-draft"))

    def planner_after(confident: bool) -> AdaptivePlanner:
        planner = AdaptivePlanner([drafter], CostModel(), config)
        # This run measured its costs: v(n) = 1 + 0.3 (n - 1), a draft step 0.3 steps.
        for n in (5, 9):
            planner.observe(RoundResult(None, None, 0, 0, n, 1 + 0.3 * (n - 1), np.ones(1)))
        drafted = DraftReport(Proposal(drafter, 1), Draft([0]), 1, 0.0, 0.3)  # a 0.3-step draft
        planner.observe(RoundResult(None, None, 0, 0, 1, 1.0, np.ones(1), (drafted,)))
        for _ in range(30):
            planner.observe(RoundResult(None, None, 0, 0, 1, 1.0, np.array([0.99 if confident else 0.1])))
        return planner

    sure, unsure = planner_after(True), planner_after(False)
    sure.begin([0])  # a generation starts: the draft model is up to date
    unsure.begin([0])
    proposal = sure.plan([0], 8)
    assert isinstance(proposal, Proposal) and proposal.num_draft >= 2
    assert unsure.plan([0], 8) is None


def test_the_targets_confidence_is_computed_only_for_a_draft_model_on_offer():
    # It costs a pass over the vocabulary per committed token, and only a draft
    # model's offer rate uses it.
    target = ToyBackend.random(16, seed=2)
    observed = []

    class Recording(AdaptivePlanner):
        def observe(self, result):
            observed.append(len(result.target_top_probs))
            super().observe(result)

    for drafters, wants in (([PromptLookup()], False),
                            ([PromptLookup(), DraftModel(target.perturbed(noise=0.5, seed=3))], True)):
        observed.clear()
        engine = Engine(target, None, num_draft=1)
        engine.configure(drafters[-1], "auto", Recording(drafters, CostModel()))
        engine.generate([1, 2, 3], SamplingParams(temperature=0.0), max_tokens=12)
        assert engine.planner.wants_confidence is wants
        assert observed and all((n > 0) is wants for n in observed)


def test_auto_does_not_ask_a_draft_model_where_the_target_is_unsure_too():
    clock = SimClock()
    target = ToyBackend.random(12, seed=5, scale=0.2, clock=clock, step_seconds=STEP,
                               token_seconds=0.3 * STEP)  # flat: the target is never sure
    draft = CountingDraftModel(target.perturbed(noise=0.0, seed=6, clock=clock,
                                                step_seconds=0.3 * STEP), min_confidence=0.5)
    # With the stop fixed (a learned one would find this drafter, an exact copy, worth
    # drafting through its unsure tokens: the test of the stop is the next one).
    config = PlannerConfig(draft_p_min=0.5, learn_stop=False)
    engine = auto_engine(target, draft, clock, true_prior(0.3, 0.3), config)
    engine.generate([0, 1, 2, 3], GREEDY, max_tokens=100)
    # The target's own confidence said the drafter would stop: it is asked at most once,
    # to measure its cost in this run (the cached one is only a starting point).
    assert draft.calls <= 1
    assert engine.planner.confidence.estimates(1)[0] < 0.1


def test_the_learned_stop_follows_acceptance_by_confidence_and_the_cost_of_a_token():
    """A drafter whose unsure drafts are still accepted (a noisy copy of the target)
    drafts on through them where a draft token is cheap (GPU-like c + Δv), and
    stops early where one is dear (CPU-like) or where unsure drafts fail."""
    from edgespec.planner import StopRule
    config = PlannerConfig()
    cheap, dear = 0.36, 0.8

    def rule(accepted_at_low: bool) -> StopRule:
        stop = StopRule(config)
        for _ in range(30):  # confident drafts are accepted; unsure ones as given
            stop.observe([0.95, 0.85, 0.25], 3 if accepted_at_low else 2)
            stop.observe([0.45, 0.35], 2 if accepted_at_low else 0)
        return stop

    # Where unsure tokens (0.25 sure) are accepted, it drafts on through them; where they
    # (0.25-0.45 sure) are rejected, it stops above them; a dear token raises the stop.
    assert rule(True).threshold(cheap, 0.9) <= 0.25
    assert rule(False).threshold(cheap, 0.6) > 0.45
    assert rule(True).threshold(dear, 0.9) > rule(True).threshold(cheap, 0.9)
    fixed = StopRule(PlannerConfig(draft_p_min=0.6, learn_stop=False))
    assert fixed.threshold(cheap, 0.9) == 0.6  # a stop the user chose stays


def test_one_rejected_draft_token_does_not_move_the_learned_stop_but_a_run_of_them_does():
    """The stop follows evidence, not one token: a drafter accepted nearly always
    keeps drafting at a confidence where one draft was rejected, and stops above
    it once rejections there are the rule."""
    from edgespec.planner import StopRule
    cost, overall = 0.75, 0.97  # CPU-like token cost; a draft model that copies the target
    stop = StopRule(PlannerConfig())
    before = stop.threshold(cost, overall)
    sure = 0.85  # a token the drafter was quite sure of ...
    assert before < sure  # (... so that, before any evidence, it drafts it)
    stop.observe([0.99, sure], 1)  # it was rejected
    assert stop.threshold(cost, overall) == before
    for _ in range(8):
        stop.observe([0.99, sure], 1)
    assert stop.threshold(cost, overall) > sure


def plain_rounds(planner: AdaptivePlanner, n: int) -> None:
    """Tell ``planner`` of ``n`` plain steps (each a one-token pass of STEP seconds), as the
    engine does: drafters that sat them out fall behind by one token each."""
    for _ in range(n):
        planner.observe(RoundResult(None, None, 0, 0, 1, STEP, np.array([])))


def probe_after(planner: AdaptivePlanner, budget: float, behind: int) -> Proposal | None:
    """What ``planner`` proposes with ``budget`` plain steps to explore with, its draft
    model ``behind`` tokens behind the text (after a generation's start)."""
    planner.begin([0, 1, 2])
    plain_rounds(planner, behind)
    planner.exploration = budget
    return planner.plan([0, 1, 2] + [1] * behind, 8)


def test_a_probe_risks_no_more_than_the_exploration_budget():
    """A draft model that would lose on what is known (α 0.5 at c = 0.5) but might
    win (a lot of optimism) is tried as a probe, its draft cut until its loss if every
    draft were rejected (the catch-up after sitting out, the drafter steps and the
    wider pass, less the one token a round always yields) fits the budget; where not
    even one draft token's does, there is no probe."""
    def planner() -> AdaptivePlanner:
        made = AdaptivePlanner([RepeatModel()], CostModel(true_prior(0.3, 0.5)),
                               PlannerConfig(model_prior=0.5, optimism=3.0))
        plain_rounds(made, 2)  # (costs are relative to this run's plain step) ...
        for n in (3, 5):  # ... and passes as the prior says: it is trusted up to 9 tokens
            made.cost.observe_target(n, STEP * (1 + 0.3 * (n - 1)))
        made.cost.observe_draft("toy-draft", 1, 0.5 * STEP)  # (measured: no retry is due)
        return made

    def worst_loss(cost: CostModel, k: int, behind: int) -> float:
        return (cost.catch_up("toy-draft", behind) if behind > 2 else 0.0) + 0.5 * k + cost.v(k + 1) - 1

    drafted = {}
    for budget, behind in [(4.0, 0), (2.0, 0), (4.0, 6), (0.5, 0)]:
        made = planner()
        proposal = probe_after(made, budget, behind)
        k = proposal.num_draft if proposal else 0
        assert proposal is None or proposal.probe
        hoped = made.best_k("toy-draft", "toy-draft", 8, optimism=made.config.optimism)[0]
        assert k == 0 or worst_loss(made.cost, k, behind) <= budget
        # As long as it hopes for, unless that would risk more than the budget holds.
        assert k == hoped or worst_loss(made.cost, k + 1, behind) > budget
        drafted[budget, behind] = k
    assert drafted[4.0, 0] > drafted[2.0, 0] >= 1  # a smaller budget, a shorter probe
    assert drafted[4.0, 0] > drafted[4.0, 6] >= 1  # a catch-up to pay first, a shorter one
    assert drafted[0.5, 0] == 0  # less than one draft token's worst case (0.8): no probe


def test_a_draft_model_that_sat_out_is_probed_again_when_it_pays_in_step():
    """A draft model's catch-up grows with every token it sits out. Priced into the
    hope of a probe, it locked a model that pays in step with the text out for the
    rest of a reply; it is what the probe risks instead, so the budget bounds it."""
    cost = CostModel(true_prior(0.3, 0.3))  # c = 0.3, v(n) = 1 + 0.3 (n - 1)
    planner = AdaptivePlanner([RepeatModel()], cost)
    plain_rounds(planner, 2)
    for _ in range(10):  # its drafts: half accepted whole, half cut after two
        planner.tracker("toy-draft").update(drafted=3, accepted=3)
        planner.tracker("toy-draft").update(drafted=3, accepted=2)
    in_step = probe_after(planner, 4.0, 0)
    assert in_step is not None and not in_step.probe  # in step with the text it pays
    behind = 30
    assert planner.best_k("toy-draft", "toy-draft", 4, behind=behind)[1] < planner.config.min_gain
    probe = probe_after(planner, 4.0, behind)
    assert probe is not None and probe.probe and probe.num_draft >= 1
    loss = cost.catch_up("toy-draft", behind) + 0.3 * probe.num_draft + cost.v(probe.num_draft + 1) - 1
    assert loss <= 4.0
    # A budget that cannot pay the catch-up: no probe.
    assert probe_after(planner, cost.catch_up("toy-draft", behind) * 0.9, behind) is None


def test_a_try_is_charged_what_its_pass_typically_costs_not_one_busy_reading():
    """The exploration budget pays for what a try lost: its passes at their typical
    cost (the cost model's medians, which every timing joins), less the tokens it
    committed. Charged one reading of the clock instead, a single pass that took ten
    times its usual time on a busy moment cost a reply its whole budget, and with it
    every later try of a draft model that was paying its way."""
    cost = CostModel(true_prior(0.3, 0.0, "lookup"))  # v(4) = 1.9
    lookup = PromptLookup()
    planner = AdaptivePlanner([lookup], cost, PlannerConfig(explore_rate=0.0))
    top = np.array([0.9])
    for _ in range(3):  # the plain step and the 4-token pass at their usual times
        planner.observe(RoundResult(None, None, 0, 0, 1, STEP, top))
        planner.observe(RoundResult(None, None, 0, 0, 4, 1.9 * STEP, top))
    before = planner.exploration
    probe = Proposal(lookup, 3, probe=True)  # a probe of 3 drafts, all rejected, on a busy moment
    drafted = DraftReport(Proposal(lookup, 8), Draft([1, 2, 3], None, "match2"), 0, 0.0, 0.0)
    planner.observe(RoundResult("lookup", "match2", 3, 0, 4, 10 * 1.9 * STEP, top, (drafted,), probe))
    assert cost.v(4) == pytest.approx(1.9)  # one slow pass does not move the median
    assert before - planner.exploration == pytest.approx(cost.v(4) - 1)  # not 18 steps


def test_a_retry_is_only_marked_when_it_drafts():
    """Costs this run never measured are retried now and then. Where the budget
    could not afford a probe, the retry was marked in flight with nothing to draft:
    no round verified it, and it still counted as lost, doubling the back-off
    without measuring anything."""
    cost = CostModel(true_prior(0.3, 0.5))  # the draft model's worst-case loss: 0.8 a token
    model = RepeatModel()
    config = PlannerConfig(min_gain=10.0, probe_gain=0.0, explore_start=0.1, explore_rate=0.0)
    planner = AdaptivePlanner([model], cost, config)
    top = np.array([0.9])
    for _ in range(2):
        planner.observe(RoundResult(None, None, 0, 0, 1, STEP, top))
    assert planner._affordable("toy-draft", 4, 0) == 0  # no probe fits the budget
    proposal = planner.plan([1, 2, 3], 4)
    assert proposal is not None and proposal.num_draft >= 1 and proposal.probe and proposal.retry


def test_a_round_cut_short_is_not_charged_to_the_next_generation():
    """A cancel (or an error) between the planner's review and the target's pass
    leaves a round in flight; the next generation starts without it."""
    cost = CostModel(true_prior(0.3, 0.0, "lookup"))
    lookup = PromptLookup()
    planner = AdaptivePlanner([lookup], cost, PlannerConfig(explore_rate=0.0, min_gain=10.0, probe_gain=0.0))
    top = np.array([0.9])
    for _ in range(2):
        planner.observe(RoundResult(None, None, 0, 0, 1, STEP, top))
    context = [1, 2, 3, 1, 2]
    proposal = planner.plan(context, 4)
    verified = planner.review(DraftReport(proposal, lookup.propose(context, 4, GREEDY, None), 0, 0.0, 0.0))
    assert verified is not None and verified.probe  # a probe, then the round is cut short
    before = planner.exploration
    planner.begin(context)
    planner.observe(RoundResult(None, None, 0, 0, 1, STEP, top))  # the next reply's plain step
    assert planner.exploration == before
    assert planner.plan(context, 4).drafter is lookup  # asked afresh in the next round


def test_closing_after_leaving_auto_mode_keeps_the_costs_it_measured(tmp_path, monkeypatch):
    """Auto mode's measured costs become the next run's prior when the engine
    closes, also after the engine was switched to a fixed k since."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    clock = SimClock()
    target, drafter = timed_pair(batch_grows=0.05, drafter_cost=0.1, noise=0.5, clock=clock)
    engine = Engine(target, drafter, num_draft="auto", planners=AutoPlanners(),
                    clock=clock)  # calibrates the pair
    path = costs_path(target, drafter)
    calibrated = json.loads(path.read_text())
    engine.generate([0, 1, 2], GREEDY, max_tokens=40)
    engine.configure(drafter, 4)
    engine.generate([0, 1, 2], GREEDY, max_tokens=8)
    engine.close()
    saved = json.loads(path.read_text())
    # The run's plain step (simulated: STEP) replaced the calibration's (host time).
    assert saved["step_seconds"] == pytest.approx(STEP) != calibrated["step_seconds"]


def test_a_fixed_k_set_after_auto_mode_drafts_without_auto_modes_stop():
    """Auto mode sets a draft model's stop for each ask and gives the model its own
    back (none here), so a fixed k set afterwards (chat's /set num_draft 4, a
    server request's k) drafts k tokens a round, as fixed k does from the start."""
    clock = SimClock()
    target, drafter = timed_pair(batch_grows=0.05, drafter_cost=0.1, noise=0.5, clock=clock)
    engine = auto_engine(target, drafter, clock, true_prior(0.05, 0.1))
    auto = engine.generate([0, 1, 2], GREEDY, max_tokens=40)
    assert auto.stats.rounds_per_drafter.get("toy-draft", 0) > 0  # auto asked the model
    assert drafter.min_confidence == 0.0
    engine.configure(drafter, 4)
    fixed = engine.generate([0, 1, 2], GREEDY, max_tokens=40)
    assert fixed.stats.rounds > 3
    assert fixed.stats.drafted_per_position[3] >= fixed.stats.rounds - 1  # all but the last: 4


def test_auto_mode_keeps_a_stop_the_user_chose(tmp_path, monkeypatch):
    """A draft model given a stop (--draft-p-min) keeps it in auto mode, which
    otherwise learns where to stop."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    target, drafter = timed_pair(batch_grows=0.1, drafter_cost=0.1, noise=0.3, clock=SimClock())
    assert auto_planner(target, drafter).config.learn_stop
    drafter.min_confidence = 0.4
    config = auto_planner(target, drafter).config
    assert not config.learn_stop and config.draft_p_min == 0.4


def test_a_draft_model_asked_while_in_step_is_not_timed_as_free():
    # After the engine prefilled it, a draft model has its first token's row at hand: asked
    # then, and unsure of that token, it took no step and no time. Timed as a step, that
    # made it free (c ~ 0), and a free drafter is asked for all it has, with no stop (chat
    # replies: drafts of 32 and 64 tokens, 2 accepted).
    drafter = DraftModel(ToyBackend.random(4, seed=0, name="toy-draft"))
    planner = AdaptivePlanner([drafter], CostModel({"v": {"2": 1.3}, "c": {"toy-draft": 0.3}}))

    def rounds(report, n=5):
        for _ in range(n):
            planner.observe(RoundResult(None, None, 0, 0, 1, 1.0, np.ones(1), (report,)))

    rounds(DraftReport(Proposal(drafter, 8), Draft([]), 0, 0.0, 1e-5))  # in step: no step taken
    assert planner.cost.c("toy-draft") == pytest.approx(0.3)
    rounds(DraftReport(Proposal(drafter, 8), Draft([]), 1, 0.2, 1e-5))  # caught up a token: a step
    assert planner.cost.c("toy-draft") == pytest.approx(0.2, rel=0.01)


def test_the_same_text_and_clock_readings_give_the_same_decisions():
    """Auto mode decides from the text and the clock alone: a run on a jittery clock,
    replayed with its readings, makes every decision again; another jitter moves them."""
    from edgespec.measure.replay import RecordingClock, ReplayingClock, record_decisions

    def run(clock_of):
        sim = SimClock()
        target, drafter = timed_pair(batch_grows=0.15, drafter_cost=0.3, noise=1.0, clock=sim)
        clock = clock_of(sim)
        engine = auto_engine(target, drafter, clock, true_prior(0.15, 0.3))
        rounds = record_decisions(engine.planner)
        text = engine.generate([0, 1, 2, 3, 0, 1, 2], GREEDY, max_tokens=160).token_ids
        return rounds, text, clock

    def jittery(seed):  # a busy machine: the clock falls behind by up to a third of a step a reading
        rng = np.random.default_rng(seed)
        late = [0.0]

        def now(sim):
            late[0] += rng.uniform(0, STEP / 3)
            return sim() + late[0]
        return lambda sim: RecordingClock(lambda: now(sim))

    rounds, text, recorded = run(jittery(1))
    replayed_rounds, replayed_text, replay = run(lambda sim: ReplayingClock(recorded.readings))
    assert replayed_rounds == rounds and replayed_text == text
    assert replay.read == len(recorded.readings)  # (it read the clock exactly as often)
    other_rounds, other_text, _ = run(jittery(2))
    assert other_text == text and other_rounds != rounds  # the clock moved them, not the text
