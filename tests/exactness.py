"""Helpers for the statistical exactness tests (shared by toy, llama.cpp and MLX).

The target's exact distribution over short continuations is computed by
enumeration, and sampled continuations are compared with it by a chi-square
goodness-of-fit test.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
from scipy import stats as scipy_stats

from edgespec import DraftModel, Engine, GenerationStats, SamplingParams, logits_to_probs
from edgespec.core.coupling import Coupling

SIGNIFICANCE = 0.001  # every exactness test uses this level


def exact_distribution(backend, prompt: list[int], params: SamplingParams,
                       length: int, shape=None) -> dict[tuple[int, ...], float]:
    """P(continuation) for every continuation of ``length`` tokens with P > 0.

    An end-of-generation token ends a continuation early and is not part of
    it, as in the engine's output. Runs the backend directly (before any
    engine takes it over) and leaves its cache empty.
    """
    out: dict[tuple[int, ...], float] = {}
    eos = backend.vocab.eos_token_ids

    def walk(prefix: tuple[int, ...], prob: float) -> None:
        if len(prefix) == length:
            out[prefix] = prob
            return
        backend.rewind(0)
        logits = backend.forward(prompt + list(prefix), last_only=True)[-1]
        if shape is not None:
            logits = shape(logits, prompt + list(prefix))
        probs = logits_to_probs(logits, params)
        for token in np.flatnonzero(probs > 0):
            if int(token) in eos:
                out[prefix] = out.get(prefix, 0.0) + prob * float(probs[token])
            else:
                walk(prefix + (int(token),), prob * float(probs[token]))

    walk((), 1.0)
    backend.rewind(0)
    return out


def sample_continuations(engine: Engine, prompt: list[int], params: SamplingParams,
                         length: int, num_samples: int, seed: int
                         ) -> tuple[Counter, GenerationStats]:
    """Counts of continuations sampled through the engine, and the summed stats."""
    rng = np.random.default_rng(seed)
    counts: Counter = Counter()
    totals = GenerationStats()
    for _ in range(num_samples):
        # Seed-invariant sampling: a seed of its own per sample (drawn from the fixed one).
        noise = Coupling(int(rng.integers(2**62))) if params.seed_invariant else rng
        generation = engine.generate(prompt, params, max_tokens=length, rng=noise)
        counts[tuple(generation.token_ids)] += 1
        totals.merge(generation.stats)
    return counts, totals


def chi_square_pvalue(counts: Counter, expected_probs: dict[tuple[int, ...], float]) -> float:
    """p-value of the counts under the exact distribution.

    Cells expected to hold fewer than 5 samples are pooled into one, as the
    chi-square approximation requires; a sample outside the support (an
    impossible continuation) gives p = 0.
    """
    num_samples = sum(counts.values())
    if any(key not in expected_probs for key in counts):
        return 0.0
    observed, expected = [], []
    pooled_obs, pooled_exp = 0, 0.0
    for key, prob in expected_probs.items():
        e = prob * num_samples
        if e < 5:
            pooled_obs += counts.get(key, 0)
            pooled_exp += e
        else:
            observed.append(counts.get(key, 0))
            expected.append(e)
    if pooled_exp > 0:
        observed.append(pooled_obs)
        expected.append(pooled_exp)
    observed_arr, expected_arr = np.array(observed, float), np.array(expected)
    statistic = float(((observed_arr - expected_arr) ** 2 / expected_arr).sum())
    return float(scipy_stats.chi2.sf(statistic, df=len(observed) - 1))


def assert_pair_samples_target(target, draft, params: SamplingParams, num_samples: int,
                               seed: int, prompt: list[int] = [1, 4, 5, 6]) -> None:
    """Three-token continuations sampled through ``target`` checking ``draft``'s drafts
    (k = 2) are distributed as the target's own (chi-square at SIGNIFICANCE), and the
    test saw both accepted and rejected drafts."""
    expected = exact_distribution(target, prompt, params, 3)
    engine = Engine(target, DraftModel(draft), num_draft=2)
    counts, totals = sample_continuations(engine, prompt, params, 3, num_samples, seed=seed)
    assert 0 < totals.accepted < totals.drafted
    assert chi_square_pvalue(counts, expected) > SIGNIFICANCE
