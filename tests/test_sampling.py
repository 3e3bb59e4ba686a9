import numpy as np
import pytest

from edgespec import SamplingParams, logits_to_probs
from edgespec.sampling import sample_from


@pytest.mark.parametrize("field, value", [
    ("temperature", -0.1), ("temperature", float("nan")), ("top_k", -1), ("top_k", 2.5),
    ("top_p", 0.0), ("top_p", 1.5), ("min_p", 1.0), ("min_p", -0.2), ("seed", -3),
])
def test_out_of_range_values_name_the_field_and_range(field, value):
    with pytest.raises(ValueError) as err:
        SamplingParams(**{field: value})
    assert field in str(err.value) and "must be" in str(err.value)


def test_greedy_is_one_hot_on_argmax():
    probs = logits_to_probs(np.array([0.1, 3.0, 2.9]), SamplingParams(temperature=0))
    assert probs.tolist() == [0.0, 1.0, 0.0]


def test_temperature_one_is_softmax():
    logits = np.array([1.0, 2.0, 0.5])
    expected = np.exp(logits) / np.exp(logits).sum()
    np.testing.assert_allclose(logits_to_probs(logits, SamplingParams(temperature=1)), expected)


def test_top_k_keeps_k_most_likely():
    probs = logits_to_probs(np.array([1.0, 4.0, 3.0, 2.0]), SamplingParams(temperature=1, top_k=2))
    assert np.flatnonzero(probs).tolist() == [1, 2]
    assert probs.sum() == pytest.approx(1.0)


def test_top_p_keeps_smallest_set_reaching_p():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    probs = logits_to_probs(logits, SamplingParams(temperature=1, top_p=0.79))
    assert np.flatnonzero(probs).tolist() == [0, 1]  # 0.5 + 0.3 reaches 0.79
    probs = logits_to_probs(logits, SamplingParams(temperature=1, top_p=0.81))
    assert np.flatnonzero(probs).tolist() == [0, 1, 2]


def test_top_p_on_a_large_vocabulary_matches_a_full_sort():
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, 50_000)
    params = SamplingParams(temperature=1, top_p=0.7)
    probs = logits_to_probs(logits, params)
    full = np.exp(logits - logits.max())
    full /= full.sum()
    order = np.argsort(-full)
    keep = np.searchsorted(np.cumsum(full[order]), 0.7) + 1
    assert set(np.flatnonzero(probs)) == set(order[:keep].tolist())


def test_min_p_drops_tokens_below_fraction_of_max():
    logits = np.log(np.array([0.6, 0.3, 0.05, 0.05]))
    probs = logits_to_probs(logits, SamplingParams(temperature=1, min_p=0.1))
    assert np.flatnonzero(probs).tolist() == [0, 1]


def test_sample_from_never_picks_zero_probability_tokens():
    rng = np.random.default_rng(0)
    probs = np.array([0.0, 0.5, 0.0, 0.5, 0.0])
    assert {sample_from(probs, rng) for _ in range(500)} == {1, 3}
