import numpy as np
import pytest

from edgespec import SamplingParams, logits_to_probs
from edgespec.core.sampling import sample_from


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
    # float32, as sampling runs (the verifier compares p and q at one token: float64 buys nothing)
    np.testing.assert_allclose(logits_to_probs(logits, SamplingParams(temperature=1)), expected,
                               rtol=1e-6)


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.7), SamplingParams(temperature=0),
                                    SamplingParams(temperature=1.3, top_k=50, top_p=0.9, min_p=0.01)])
def test_rows_at_once_equal_one_row_at_a_time(params):
    logits = np.random.default_rng(1).normal(0, 3, (3, 3000)).astype(np.float32)
    rows = logits_to_probs(logits, params)
    assert rows.dtype == np.float32 and rows.shape == logits.shape
    for row, probs in zip(logits, rows):
        np.testing.assert_array_equal(logits_to_probs(row, params), probs)
    out = np.empty(3000, np.float32)
    assert logits_to_probs(logits[1], params, out=out) is out
    np.testing.assert_array_equal(out, rows[1])


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



def test_sample_from_across_blocks_matches_the_distribution():
    """Two-level sampling (a block of ids by its mass, then an id within it) over a
    vocabulary of several blocks, some of them empty: chi-square goodness of fit,
    seed fixed, significance 0.001; ids without mass never come out."""
    from collections import Counter

    from exactness import SIGNIFICANCE, chi_square_pvalue
    vocab = 5000  # four blocks of 1024 ids and a part
    probs = np.zeros(vocab, np.float32)
    support = [3, 1023, 1024, 2500, 2501, 4999]  # at block edges; block 3 holds none
    probs[support] = [0.05, 0.3, 0.1, 0.2, 0.25, 0.1]
    rng = np.random.default_rng(7)
    counts = Counter((sample_from(probs, rng),) for _ in range(20_000))
    assert set(counts) <= {(i,) for i in support}
    assert chi_square_pvalue(counts, {(i,): float(probs[i]) for i in support}) > SIGNIFICANCE


@pytest.mark.parametrize("temperature", [0.05, 0.7, 1.0, 3.0])
@pytest.mark.parametrize("offset", [-300.0, -20.0, 0.0, 40.0, 300.0])
def test_probabilities_match_a_float64_softmax_at_any_logit_scale(temperature, offset):
    """Rows whose exp(logit / T) fits float32 skip the shift by the maximum; the
    rest (very low T, logits far from 0) take it: both agree with float64 softmax."""
    from edgespec.core.sampling import ProbRows
    rng = np.random.default_rng(1)
    logits = (rng.normal(0, 4, (2, 3000)) + offset).astype(np.float32)
    scaled = logits.astype(np.float64) / temperature
    expected = np.exp(scaled - scaled.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    params = SamplingParams(temperature=temperature)
    probs = logits_to_probs(logits, params)
    np.testing.assert_allclose(probs, expected, rtol=1e-4, atol=1e-12)
    rows = ProbRows(logits, params)
    for i in range(2):
        np.testing.assert_allclose(rows[i], expected[i], rtol=1e-4, atol=1e-12)
        top = int(np.argmax(expected[i]))
        assert rows.prob(i, top) == pytest.approx(expected[i, top], rel=1e-5)
        assert rows.top(2)[i] == pytest.approx(expected[i].max(), rel=1e-5)


def llama_cpp_typical(probs: np.ndarray, p: float) -> set[int]:
    """llama.cpp's llama_sampler_typical_apply, line by line (min_keep 0): the tokens kept."""
    entropy = -(probs * np.log(probs)).sum()
    shifted = np.abs(-np.log(probs) - entropy)
    indices = sorted(range(len(probs)), key=lambda i: shifted[i])
    cum_sum, last_idx = 0.0, len(indices)
    for i, idx in enumerate(indices):
        cum_sum += probs[idx]
        if cum_sum > p:
            last_idx = i + 1
            break
    return set(indices[:last_idx])


@pytest.mark.parametrize("seed, typical_p", [(0, 0.5), (1, 0.9), (2, 0.2), (3, 0.99)])
def test_typical_p_keeps_what_llama_cpp_keeps(seed, typical_p):
    logits = np.random.default_rng(seed).normal(0, 2, 200)
    probs = logits_to_probs(logits, SamplingParams(temperature=1, typical_p=typical_p))
    softmax = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    kept = llama_cpp_typical(softmax, typical_p)
    assert set(np.flatnonzero(probs)) == kept and len(kept) < len(logits)
    np.testing.assert_allclose(probs[list(kept)], softmax[list(kept)] / softmax[list(kept)].sum(), rtol=1e-5)


@pytest.mark.parametrize("filters", [dict(top_p=0.8), dict(min_p=0.1), dict(typical_p=0.7),
                                     dict(top_k=20, top_p=0.9, min_p=0.02)])
def test_temperature_last_filters_at_temperature_one_then_scales_what_they_keep(filters):
    logits = np.random.default_rng(4).normal(0, 2, 300)
    at_one = logits_to_probs(logits, SamplingParams(temperature=1, **filters)) > 0
    last = logits_to_probs(logits, SamplingParams(temperature=0.5, temperature_last=True, **filters))
    scaled = np.where(at_one, np.exp((logits - logits.max()) / 0.5), 0.0)
    np.testing.assert_allclose(last, scaled / scaled.sum(), rtol=1e-5, atol=1e-9)
    first = logits_to_probs(logits, SamplingParams(temperature=0.5, **filters))
    assert (first > 0).sum() != at_one.sum()  # the order changes what is kept here
