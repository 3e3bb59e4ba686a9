"""Auto mode: the policy's choices, greedy equality and exactness with it on."""

import numpy as np
import pytest

from edgespec import DraftModel, Engine, PromptLookup, SamplingParams
from edgespec.adaptive import AcceptanceTracker, AdaptivePolicy, CostModel, calibrate
from edgespec.backends.toy import ToyBackend
from exactness import SIGNIFICANCE, chi_square_pvalue, exact_distribution, sample_continuations

GREEDY = SamplingParams(temperature=0)


class FixedCosts(CostModel):
    """Costs that stay as given: a toy backend's timings are noise, not costs."""

    def observe_target(self, n: int, seconds: float) -> None:
        pass

    def observe_drafter(self, name: str, tokens: int, seconds: float) -> None:
        pass

    def observe_sync(self, name: str, tokens: int, seconds: float) -> None:
        pass


def costs(*, batch_grows: float, drafter: float, name: str = "toy-draft",
          model: type[CostModel] = CostModel) -> CostModel:
    """v(n) = 1 + batch_grows * (n - 1); drafter step = ``drafter`` target steps."""
    return model({n: 1.0 + batch_grows * (n - 1) for n in (1, 2, 4, 8, 9)},
                 {name: drafter, "lookup": 0.0})


def test_expected_tokens_follow_the_acceptance_rates():
    tracker = AcceptanceTracker(prior=0.5)
    assert tracker.expected_tokens(0) == 1.0
    assert tracker.expected_tokens(2) == pytest.approx(1 + 0.5 + 0.25)
    for _ in range(200):
        tracker.update(drafted=3, accepted=3)
    assert all(a > 0.9 for a in tracker.alpha) and tracker.expected_tokens(3) > 3.5
    for _ in range(200):
        tracker.update(drafted=3, accepted=0)  # only position 0 was tested
    assert tracker.alpha[0] < 0.1 and tracker.alpha[1] > 0.8  # untested: still high


def test_a_drafter_that_stops_early_is_expected_to_yield_less():
    steady, hesitant = AcceptanceTracker(prior=0.9), AcceptanceTracker(prior=0.9)
    for _ in range(50):
        steady.update(drafted=2, accepted=2)
        hesitant.update(drafted=0, accepted=0, stopped=True)  # not confident: drafted nothing
        hesitant.update(drafted=2, accepted=2)
    v = costs(batch_grows=0.3, drafter=0.3).v
    assert hesitant.offer.estimates(1)[0] < 0.7 < steady.offer.estimates(1)[0]
    assert hesitant.expected_speed(2, 0.3, v) < steady.expected_speed(2, 0.3, v)


def test_policy_speculates_only_when_it_pays():
    cheap = AdaptivePolicy(costs(batch_grows=0.05, drafter=0.1))
    plan = cheap.plan_model("toy-draft", limit=8)
    assert plan.drafter == "toy-draft" and plan.num_draft >= 1
    for _ in range(50):  # drafts keep being accepted: draft further
        cheap.observe_round("toy-draft", drafted=plan.num_draft, accepted=plan.num_draft)
        plan = cheap.plan_model("toy-draft", limit=8)
    assert plan.num_draft >= 6
    # A pass over n tokens costing n steps: nothing beats plain decoding, ever.
    costly = AdaptivePolicy(costs(batch_grows=1.0, drafter=0.7))
    assert all(costly.plan_model("toy-draft", limit=8).num_draft == 0 for _ in range(300))


def test_a_losing_drafter_is_tried_again_once_its_evidence_has_aged():
    policy = AdaptivePolicy(costs(batch_grows=0.05, drafter=0.1))
    for _ in range(40):
        policy.observe_round("toy-draft", drafted=2, accepted=0)
    plans = [policy.plan_model("toy-draft", limit=8) for _ in range(1000)]
    first_try = next(i for i, p in enumerate(plans) if p.num_draft)
    assert 10 < first_try < 1000 and plans[first_try].probe


def test_lookup_matches_are_verified_only_as_far_as_they_pay():
    policy = AdaptivePolicy(costs(batch_grows=0.3, drafter=0.5))
    for _ in range(100):
        policy.observe_round("lookup:8", drafted=8, accepted=8)  # long matches copy well
        policy.observe_round("lookup:2", drafted=4, accepted=0)  # short ones do not
    long = policy.plan_lookup(match_length=8, available=8, limit=8)
    assert long.drafter == "lookup" and long.num_draft >= 6
    assert policy.plan_lookup(match_length=2, available=8, limit=8).num_draft == 0


def test_catching_up_a_stale_drafter_counts_against_it():
    policy = AdaptivePolicy(costs(batch_grows=0.3, drafter=0.3))
    for _ in range(20):
        policy.observe_round("toy-draft", drafted=2, accepted=2)
    _, fresh = policy.best_k("toy-draft", 4)
    _, stale = policy.best_k("toy-draft", 4, behind=200)
    assert stale < fresh


@pytest.mark.parametrize("batch_grows, drafter_cost", [(0.05, 0.1), (1.0, 0.9)],
                         ids=["speculation-pays", "speculation-loses"])
def test_auto_greedy_equals_plain(batch_grows, drafter_cost):
    target = ToyBackend.random(12, seed=5, scale=2.0)
    draft = DraftModel(target.perturbed(noise=0.7, seed=6))
    policy = AdaptivePolicy(costs(batch_grows=batch_grows, drafter=drafter_cost))
    engine = Engine(target, draft, num_draft="auto", policy=policy)
    prompt = [0, 1, 2, 3, 0, 1]
    auto = engine.generate(prompt, GREEDY, max_tokens=120)
    plain = engine.generate(prompt, GREEDY, max_tokens=120, speculative=False)
    assert auto.token_ids == plain.token_ids
    s = auto.stats
    assert s.drafter == "auto(lookup+toy-draft)"
    assert sum(s.rounds_per_drafter.values()) == s.rounds
    if drafter_cost < 0.5:
        assert s.rounds_per_drafter.get("toy-draft", 0) > 0 and s.plain_steps < 20
    else:
        assert s.plain_steps > 100 and s.rounds == s.probes  # only probes drafted


def test_exactness_with_auto_on():
    """Chi-square at significance 0.001, 20,000 samples of 3 tokens, fixed seed."""
    target = ToyBackend.random(8, seed=1, scale=1.5)
    draft = DraftModel(target.perturbed(noise=1.0, seed=2))
    policy = AdaptivePolicy(costs(batch_grows=0.05, drafter=0.1))
    engine = Engine(target, draft, num_draft="auto", policy=policy)
    params = SamplingParams(temperature=1.0)
    prompt = [0, 1, 2, 0, 1]
    expected = exact_distribution(target, prompt, params, 3)
    counts, totals = sample_continuations(engine, prompt, params, 3, 20_000, seed=41)
    assert chi_square_pvalue(counts, expected) > SIGNIFICANCE
    # Both drafters took rounds, and the policy varied k.
    assert totals.rounds_per_drafter.get("lookup", 0) > 0
    assert totals.rounds_per_drafter.get("toy-draft", 0) > 0
    assert 0 < totals.accepted < totals.drafted


def test_low_confidence_stops_the_draft_early():
    target = ToyBackend.random(12, seed=5, scale=0.2)  # flat distributions: low confidence
    rng = np.random.default_rng(0)
    drafter = DraftModel(target.perturbed(noise=0.0, seed=6), min_confidence=0.5)
    assert drafter.propose([0, 1], 4, GREEDY, rng).token_ids == []
    confident = DraftModel(ToyBackend.random(12, seed=5, scale=20.0), min_confidence=0.5)
    assert len(confident.propose([0, 1], 4, GREEDY, rng).token_ids) == 4


def test_calibration_measures_every_size_and_leaves_caches_empty():
    target = ToyBackend.random(8, seed=1)
    draft = target.perturbed(noise=0.1, seed=3)
    cost = calibrate(target, [("toy-draft", draft)], sizes=(1, 3), repeats=1)
    assert set(cost.target_s) == {1, 3} and cost.drafter_s["toy-draft"] > 0
    assert cost.sync_s["toy-draft"] > 0
    assert target.n_past == 0 and draft.n_past == 0
    assert cost.v(1) == pytest.approx(1.0) and cost.v(2) > 0


class CountingDraftModel(DraftModel):
    """A real draft model that counts how often the engine asks it for a draft."""

    calls = 0

    def propose(self, *args, **kwargs):
        self.calls += 1
        return super().propose(*args, **kwargs)


def generate_auto_and_plain(target: ToyBackend, draft: DraftModel):
    """100 greedy tokens in auto mode (costs fixed), checked equal to plain decoding."""
    policy = AdaptivePolicy(costs(batch_grows=0.3, drafter=0.3, model=FixedCosts))
    engine = Engine(target, draft, num_draft="auto", policy=policy)
    prompt = [0, 1, 2, 3]
    auto = engine.generate(prompt, GREEDY, max_tokens=100)
    assert auto.token_ids == engine.generate(prompt, GREEDY, max_tokens=100,
                                             speculative=False).token_ids
    return auto, policy


def test_auto_stops_asking_a_drafter_that_is_never_confident():
    target = ToyBackend.random(12, seed=5, scale=20.0)  # peaked: the target is sure
    unsure = ToyBackend.random(12, seed=6, scale=0.2, name="toy-draft")  # flat: never sure
    draft = CountingDraftModel(unsure, min_confidence=0.5)
    auto, policy = generate_auto_and_plain(target, draft)
    assert auto.stats.rounds_per_drafter.get("toy-draft", 0) == 0
    assert 1 <= draft.calls <= 20  # tried, found unsure, then asked only now and then
    offer = policy.tracker("toy-draft").offer
    assert offer.trials[0] > 0 and offer.hits[0] == 0  # every try was a stop, and was counted


def test_the_targets_own_confidence_is_the_prior_of_the_draft_models_offers():
    sure = AdaptivePolicy(costs(batch_grows=0.3, drafter=0.3))
    unsure = AdaptivePolicy(costs(batch_grows=0.3, drafter=0.3))
    sure.observe_confidence([True] * 30)
    unsure.observe_confidence([False] * 30)
    assert sure.plan_model("toy-draft", limit=8).num_draft >= 2
    assert unsure.plan_model("toy-draft", limit=8).num_draft == 0


def test_auto_does_not_ask_a_draft_model_where_the_target_is_unsure_too():
    target = ToyBackend.random(12, seed=5, scale=0.2)  # flat: the target is never sure
    draft = CountingDraftModel(target.perturbed(noise=0.0, seed=6), min_confidence=0.5)
    _, policy = generate_auto_and_plain(target, draft)
    assert draft.calls == 0  # the target's own confidence said the drafter would stop
    assert policy.confidence.estimates(1)[0] < 0.1
