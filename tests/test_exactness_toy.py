"""Statistical exactness of speculative decoding on the numpy toy model.

Each test draws 20,000 three-token continuations through the engine and
compares their distribution with the target's exact one by a chi-square
test at significance 0.001 (exactness.SIGNIFICANCE), with fixed seeds. A
deliberately broken acceptance rule must fail the same test.
"""

import numpy as np
import pytest

import edgespec.core.engine
import edgespec.core.acceptance
from edgespec.core.acceptance import Verdict
from edgespec import DraftModel, Engine, PromptLookup, SamplingParams
from edgespec.backends.toy import ToyBackend
from edgespec.core.sampling import sample_from
from exactness import SIGNIFICANCE, chi_square_pvalue, exact_distribution, sample_continuations

VOCAB = 8
LENGTH = 3
NUM_SAMPLES = 20_000
PROMPT = [0, 1, 2, 0, 1]  # "abcab": has repeats, so prompt lookup finds matches


def toy_target() -> ToyBackend:
    return ToyBackend.random(VOCAB, seed=1, scale=1.5)


def pvalue_through_engine(engine, target, params, seed):
    """Chi-square p-value of the engine's samples, and their summed stats."""
    expected = exact_distribution(target, PROMPT, params, LENGTH)
    counts, totals = sample_continuations(engine, PROMPT, params, LENGTH, NUM_SAMPLES, seed)
    return chi_square_pvalue(counts, expected), totals


@pytest.mark.slow
def test_draft_model_at_temperature_1_matches_target():
    target = toy_target()
    engine = Engine(target, DraftModel(target.perturbed(noise=1.0, seed=2)), num_draft=3)
    pvalue, totals = pvalue_through_engine(engine, target, SamplingParams(temperature=1.0), seed=10)
    assert pvalue > SIGNIFICANCE
    # Both outcomes of the acceptance test really happened.
    assert 0 < totals.accepted < totals.drafted


@pytest.mark.slow
def test_temperature_top_k_top_p_match_target():
    target = toy_target()
    engine = Engine(target, DraftModel(target.perturbed(noise=1.0, seed=2)), num_draft=3)
    params = SamplingParams(temperature=0.7, top_k=5, top_p=0.9)
    # The filters really cut the support: fewer than V^3 continuations are possible.
    assert len(exact_distribution(target, PROMPT, params, LENGTH)) < VOCAB ** LENGTH
    pvalue, totals = pvalue_through_engine(engine, target, params, seed=11)
    assert pvalue > SIGNIFICANCE
    assert 0 < totals.accepted < totals.drafted


def test_prompt_lookup_matches_target():
    target = toy_target()
    engine = Engine(target, PromptLookup(min_ngram=1, max_ngram=3), num_draft=3)
    pvalue, totals = pvalue_through_engine(engine, target, SamplingParams(temperature=1.0), seed=12)
    assert pvalue > SIGNIFICANCE
    assert totals.drafted > NUM_SAMPLES and 0 < totals.accepted < totals.drafted


@pytest.mark.slow
def test_identical_drafter_accepts_every_draft_and_matches_target():
    target = toy_target()
    twin = ToyBackend(target.table.copy(), name="twin")
    engine = Engine(target, DraftModel(twin), num_draft=2)
    pvalue, totals = pvalue_through_engine(engine, target, SamplingParams(temperature=1.0), seed=13)
    assert pvalue > SIGNIFICANCE
    # k = 2 drafts plus the bonus token make all 3 tokens in a single round.
    assert totals.rounds == NUM_SAMPLES
    assert totals.drafted == 2 * NUM_SAMPLES
    assert totals.accepted == totals.drafted


def broken_rejection_sample(target_probs, draft_token_ids, draft_probs, rng, *, draft_scales=None,
                            position=0):
    """The classic bug: on rejection, resample from p instead of norm(max(0, p - q))."""
    accepted = []
    for i, token in enumerate(draft_token_ids):
        q_token = 1.0 if draft_probs is None else \
            draft_probs[i, token] * (1.0 if draft_scales is None else draft_scales[i])
        if rng.random() * q_token < target_probs[i][token]:
            accepted.append(int(token))
            continue
        return Verdict(accepted, sample_from(target_probs[i], rng))
    return Verdict(accepted, sample_from(target_probs[len(draft_token_ids)], rng))


def test_broken_rule_fails_the_same_test(monkeypatch):
    monkeypatch.setattr(edgespec.core.acceptance, "rejection_sample", broken_rejection_sample)
    target = toy_target()
    engine = Engine(target, DraftModel(target.perturbed(noise=1.0, seed=2)), num_draft=3)
    pvalue, _ = pvalue_through_engine(engine, target, SamplingParams(temperature=1.0), seed=10)
    assert pvalue < SIGNIFICANCE


@pytest.mark.slow
def test_drafter_with_extra_vocabulary_rows_matches_target():
    """A drafter with 2 more ids than the target (padding rows, as in some model
    families) puts mass where p = 0: those drafts are rejections, exactly."""
    target = toy_target()
    rng = np.random.default_rng(3)
    table = rng.normal(0.0, 1.5, (VOCAB + 2,) * 3)
    table[:VOCAB, :VOCAB, :VOCAB] = target.table + rng.normal(0.0, 0.5, target.table.shape)
    table[..., VOCAB:] += 1.0  # the extra ids get real probability
    engine = Engine(target, DraftModel(ToyBackend(table, name="wide")), num_draft=3)
    pvalue, totals = pvalue_through_engine(engine, target, SamplingParams(temperature=1.0), seed=14)
    assert pvalue > SIGNIFICANCE
    assert 0 < totals.accepted < totals.drafted
