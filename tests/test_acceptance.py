"""The acceptance rule on hand-built distributions."""

import numpy as np
import pytest

from edgespec import greedy_verify, rejection_sample
from edgespec.core.acceptance import runnable_drafts


def sample(target, drafts, draft_probs, rng):
    """The committed tokens of one round."""
    return rejection_sample(target, drafts, draft_probs, rng).token_ids


def test_the_verdict_names_accepted_drafts_and_the_targets_own_token():
    target = np.array([[0, 1, 0], [0, 0, 1], [1, 0, 0]], float)  # [k+1, V]
    verdict = rejection_sample(target, [1, 2], None, np.random.default_rng(0))
    assert verdict.accepted_token_ids == [1, 2] and verdict.num_accepted == 2
    assert verdict.next_token_id == 0  # the bonus token
    rejected = rejection_sample(target, [0, 2], None, np.random.default_rng(0))
    assert rejected.num_accepted == 0 and rejected.next_token_id == 1  # the recovered token


def test_a_draft_outside_the_targets_vocabulary_is_a_certain_rejection():
    """The target (V = 3) runs only up to the out-of-vocabulary draft (id 4): k rows."""
    p = np.array([[0.0, 1.0, 0.0], [0.2, 0.3, 0.5]])  # rows for positions 0 and 1
    q = np.array([[0.0, 1.0, 0.0, 0.0, 0.0], [0.0, 0.3, 0.0, 0.0, 0.7]])  # V' = 5
    assert runnable_drafts([1, 4], 3) == 1
    rng = np.random.default_rng(4)
    outs = [rejection_sample(p, [1, 4], q, rng) for _ in range(2000)]
    assert all(v.accepted_token_ids == [1] for v in outs)
    # The replacement comes from norm(max(0, p - q)) over the target's ids: 0 or 2.
    counts = np.bincount([v.next_token_id for v in outs], minlength=3)
    assert counts[1] == 0 and counts[0] > 0 and counts[2] > 0
    residual = np.array([0.2, 0.0, 0.5]) / 0.7
    assert abs(counts[2] / 2000 - residual[2]) < 5 * np.sqrt(residual[2] * (1 - residual[2]) / 2000)
    greedy = greedy_verify([1, 2], [1, 4])  # k rows for k drafts, the last out of vocabulary
    assert greedy.accepted_token_ids == [1] and greedy.next_token_id == 2
    with pytest.raises(ValueError, match="k\\+1"):  # an id out of vocabulary that is not last
        rejection_sample(p, [4, 1], q, rng)


def test_drafts_the_target_gives_probability_one_are_always_accepted():
    target = np.array([[0, 1, 0], [0, 0, 1], [1, 0, 0]], float)  # [k+1, V]
    rng = np.random.default_rng(0)
    for _ in range(100):
        assert sample(target, [1, 2], None, rng) == [1, 2, 0]


def test_impossible_draft_is_rejected_and_replaced_from_the_residual():
    target = np.array([[0.5, 0.5, 0.0], [1 / 3] * 3], float)
    draft = np.array([[0.0, 0.0, 1.0]])
    rng = np.random.default_rng(0)
    seen = {tuple(sample(target, [2], draft, rng)) for _ in range(200)}
    assert seen == {(0,), (1,)}


def test_one_hot_rejection_never_resamples_the_rejected_token():
    target = np.array([[0.6, 0.3, 0.1], [1 / 3] * 3])
    rng = np.random.default_rng(1)
    for _ in range(500):
        out = sample(target, [0], None, rng)
        if len(out) == 1:  # rejected: the correction is never the draft itself
            assert out[0] != 0


def test_accepted_prefix_then_exactly_one_token():
    rng = np.random.default_rng(2)
    target = rng.dirichlet(np.ones(6), size=5)  # k = 4
    draft = rng.dirichlet(np.ones(6), size=4)
    for _ in range(200):
        drafts = [int(rng.integers(6)) for _ in range(4)]
        out = sample(target, drafts, draft, rng)
        assert 1 <= len(out) <= 5
        assert out[:-1] == drafts[:len(out) - 1]


def test_shape_mismatch_is_a_clear_error():
    # (k rows for k drafts are right when the last was not run: a grammar refused it)
    for rows in (1, 4):
        with pytest.raises(ValueError, match="k\\+1"):
            rejection_sample(np.ones((rows, 3)) / 3, [0, 1], None, np.random.default_rng(0))


def test_single_position_acceptance_probability_is_sum_of_min():
    """P(accept) = sum_x min(p(x), q(x)), the defining property of the rule."""
    p = np.array([0.5, 0.3, 0.2])
    q = np.array([0.2, 0.2, 0.6])
    target = np.stack([p, p])
    rng = np.random.default_rng(3)
    n, accepted = 40_000, 0
    for _ in range(n):
        token = int(rng.choice(3, p=q))
        accepted += rejection_sample(target, [token], q[None], rng).num_accepted == 1
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
    assert greedy_verify(argmax, drafts).token_ids == out


def test_rows_computed_as_read_give_the_same_verdicts_as_the_full_array():
    """The engine verifies from lazily computed rows of p (ProbRows, in a scratch
    buffer reused round after round), with q as a draft model reports it (rows up
    to a factor each): with the same random stream, every verdict equals the
    reference's on the full [k+1, V] array and normalised q. The factors are powers
    of two, which scale every float exactly, so the verdicts must be identical."""
    from edgespec import SamplingParams
    from edgespec.core.sampling import ProbRows, Scratch, logits_to_probs
    scratch = Scratch()
    rng = np.random.default_rng(3)
    params = SamplingParams(temperature=0.8, top_p=0.95)
    vocab = 3000
    for trial in range(200):
        k = int(rng.integers(0, 5))
        logits = rng.normal(0, 2.5, (k + 1, vocab)).astype(np.float32)
        full = logits_to_probs(logits, params)
        drafts = [int(np.argmax(full[i])) if rng.random() < 0.6 else int(rng.integers(vocab))
                  for i in range(k)]
        q = None if trial % 2 else logits_to_probs(
            logits[:k] + rng.normal(0, 1, (k, vocab)).astype(np.float32), params)
        seed = int(rng.integers(1 << 30))
        lazy = ProbRows(logits, params, scratch)
        expected = rejection_sample(full, drafts, q, np.random.default_rng(seed))
        got = rejection_sample(lazy, drafts, q, np.random.default_rng(seed))
        assert got == expected
        np.testing.assert_array_equal(lazy.top(got.num_accepted + 1),
                                      full[:got.num_accepted + 1].max(-1))
        if q is not None:
            factors = 2.0 ** rng.integers(-20, 20, k)
            unnormalised = q * factors[:, None].astype(np.float32)
            assert rejection_sample(ProbRows(logits, params, scratch), drafts, unnormalised,
                                    np.random.default_rng(seed), draft_scales=1 / factors) == expected
