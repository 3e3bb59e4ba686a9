"""The acceptance rule on hand-built distributions."""

import inspect
from typing import Sequence

import numpy as np
import pytest

from edgespec import greedy_verify, rejection_sample


def test_rejection_sample_signature_is_the_documented_one():
    sig = inspect.signature(rejection_sample)
    assert list(sig.parameters) == ["target_probs", "draft_token_ids", "draft_probs", "rng"]
    assert sig.parameters["draft_probs"].annotation == "np.ndarray | None"
    assert sig.parameters["target_probs"].annotation == "np.ndarray"
    assert sig.parameters["draft_token_ids"].annotation == "Sequence[int]"
    assert sig.parameters["rng"].annotation == "np.random.Generator"
    assert sig.return_annotation == "list[int]"


def test_drafts_the_target_gives_probability_one_are_always_accepted():
    target = np.array([[0, 1, 0], [0, 0, 1], [1, 0, 0]], float)  # [k+1, V]
    rng = np.random.default_rng(0)
    for _ in range(100):
        assert rejection_sample(target, [1, 2], None, rng) == [1, 2, 0]


def test_impossible_draft_is_rejected_and_replaced_from_the_residual():
    target = np.array([[0.5, 0.5, 0.0], [1 / 3] * 3], float)
    draft = np.array([[0.0, 0.0, 1.0]])
    rng = np.random.default_rng(0)
    seen = {tuple(rejection_sample(target, [2], draft, rng)) for _ in range(200)}
    assert seen == {(0,), (1,)}


def test_one_hot_rejection_never_resamples_the_rejected_token():
    target = np.array([[0.6, 0.3, 0.1], [1 / 3] * 3])
    rng = np.random.default_rng(1)
    for _ in range(500):
        out = rejection_sample(target, [0], None, rng)
        if len(out) == 1:  # rejected: the correction is never the draft itself
            assert out[0] != 0


def test_accepted_prefix_then_exactly_one_token():
    rng = np.random.default_rng(2)
    target = rng.dirichlet(np.ones(6), size=5)  # k = 4
    draft = rng.dirichlet(np.ones(6), size=4)
    for _ in range(200):
        drafts = [int(rng.integers(6)) for _ in range(4)]
        out = rejection_sample(target, drafts, draft, rng)
        assert 1 <= len(out) <= 5
        assert out[:-1] == drafts[:len(out) - 1]


def test_shape_mismatch_is_a_clear_error():
    with pytest.raises(ValueError, match="k\\+1"):
        rejection_sample(np.ones((2, 3)) / 3, [0, 1], None, np.random.default_rng(0))


def test_single_position_acceptance_probability_is_sum_of_min():
    """P(accept) = sum_x min(p(x), q(x)), the defining property of the rule."""
    p = np.array([0.5, 0.3, 0.2])
    q = np.array([0.2, 0.2, 0.6])
    target = np.stack([p, p])
    rng = np.random.default_rng(3)
    n, accepted = 40_000, 0
    for _ in range(n):
        token = int(rng.choice(3, p=q))
        accepted += len(rejection_sample(target, [token], q[None], rng)) == 2
    expected = np.minimum(p, q).sum()  # 0.6
    # 5 standard errors: fails by chance with probability < 1e-6.
    assert abs(accepted / n - expected) < 5 * np.sqrt(expected * (1 - expected) / n)


@pytest.mark.parametrize("argmax, drafts, out", [
    ([3, 1, 4], [3, 1], [3, 1, 4]),   # all accepted, then the bonus
    ([3, 1, 4], [3, 2], [3, 1]),      # second rejected, corrected to the argmax
    ([5, 1, 4], [3, 1], [5]),         # first rejected
    ([7], [], [7]),                   # no drafts: a plain step
])
def test_greedy_verify(argmax, drafts, out):
    assert greedy_verify(argmax, drafts) == out
