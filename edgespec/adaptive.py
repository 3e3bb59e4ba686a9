"""Adaptive speculation: pick the drafter and k each round, or decode plainly.

Expected speed of a round, in tokens per plain target step (DESIGN.md):

    S(k) = E(k) / (k·c + v(k+1)),   E(k) = 1 + Σ_{j=1..k} Π_{i<=j} α_i

where c is the drafter's step cost, v(n) the target's n-token pass, both in
units of a one-token target pass, and α_i the probability that draft position
i is accepted given the ones before it were. Plain decoding has S = 1. The
costs are measured (a short calibration at load, cached per model pair and
machine, then updated from every pass). A draft model that stops early when
unsure (``--draft-p-min``) also has an offer rate per position: how often it
drafts there at all; a stop still costs its drafter step, so S counts it. The
prior of that rate is how often the target itself was that sure of the tokens
it committed, which is known at every step without asking the drafter.

α and the offer rates are tracked per drafter (prompt lookup per match
length) as a prior plus exponentially weighted evidence, so they follow the
content. Decisions add a little optimism (a fraction of a standard error), so
a drafter that may pay is tried until the evidence says otherwise; evidence
ages while a drafter is not tried, so a losing one is tried again now and
then and a change of content is noticed. A draft model that fell behind
during plain steps must catch up before drafting; that cost counts too.

Choosing the proposal from past rounds only (never from the target's output
for the round being verified) keeps the acceptance rule exact.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .backends.base import Backend

# The policy's constants were tuned with scripts/policy_sim.py (auto mode replayed
# on recorded traces of the bench prompts, checked on other prompts) and then
# measured with `edgespec bench`.
MAX_DRAFT = 8             # the longest draft auto mode proposes
DECAY = 0.95              # weight of the past in the acceptance and cost averages
PRIOR_WEIGHT = 3.0        # pseudo-observations behind a prior acceptance rate
AGING = 0.99              # evidence kept per round in which a drafter was not tried
OPTIMISM = 0.35           # standard errors added to α when deciding (explores the unsure)
MIN_GAIN = 1.04           # speculate only when it is expected to beat plain by this much
PROBE_GAIN = 1.04         # ... or, as a probe, when it might (with optimism)
AUTO_DRAFT_P_MIN = 0.7    # auto mode: a draft model stops below this top probability
# Starting guesses of α. Prompt lookup's depend on the match length: a 2-token
# match is often a coincidence, an 8-token one usually a copy in progress.
MODEL_PRIOR = 0.95
OFFER_PRIOR = 1.0         # how often a draft model is confident enough to draft at all
OFFER_WEIGHT = 6.0        # pseudo-observations behind it
CONFIDENCE_PRIOR = 0.4    # the target's confidence before a response's first token
CONFIDENCE_WEIGHT = 2.0   # pseudo-observations behind it
LOOKUP_PRIORS = {"lookup:2": 0.3, "lookup:3": 0.4, "lookup:4": 0.6, "lookup:8": 0.8}
LOOKUP_POOLED_PRIOR = 0.5  # all match lengths together
LOOKUP_MAX_NGRAM = 8
CALIBRATION_SIZES = (1, 2, 3, 5, 9)
SYNC_SIZE = 16            # tokens of the drafter's batched catch-up timed at calibration


@dataclass
class CostModel:
    """Measured seconds of target passes and drafter steps, as running averages."""

    target_s: dict[int, float] = field(default_factory=dict)   # n tokens -> seconds per pass
    drafter_s: dict[str, float] = field(default_factory=dict)  # drafter -> seconds per draft token
    sync_s: dict[str, float] = field(default_factory=dict)     # drafter -> seconds per caught-up token

    def observe_target(self, n: int, seconds: float) -> None:
        self.target_s[n] = _average(self.target_s.get(n), seconds)

    def observe_drafter(self, name: str, tokens: int, seconds: float) -> None:
        if tokens > 0:
            self.drafter_s[name] = _average(self.drafter_s.get(name), seconds / tokens)

    def observe_sync(self, name: str, tokens: int, seconds: float) -> None:
        if tokens > 0:
            self.sync_s[name] = _average(self.sync_s.get(name), seconds / tokens)

    def v(self, n: int) -> float:
        """Time of an n-token target pass / time of a 1-token pass (interpolated)."""
        if 1 not in self.target_s:
            return float(n)  # nothing measured: assume no batching gain
        sizes = sorted(self.target_s)
        times = [self.target_s[s] for s in sizes]
        if len(sizes) == 1:
            return float(n)
        seconds = float(np.interp(n, sizes, times)) if n <= sizes[-1] else \
            times[-1] + (n - sizes[-1]) * (times[-1] - times[-2]) / (sizes[-1] - sizes[-2])
        return seconds / self.target_s[1]

    def c(self, name: str) -> float:
        """Time of one drafter step / time of one plain target step."""
        if name not in self.drafter_s or 1 not in self.target_s:
            return 0.0 if name == "lookup" else 0.5
        return self.drafter_s[name] / self.target_s[1]

    def sync(self, name: str) -> float:
        """Time for the drafter to catch up one token (batched) / one plain target step."""
        if name not in self.sync_s or 1 not in self.target_s:
            return self.c(name) / 4  # a batched token costs a fraction of a step
        return self.sync_s[name] / self.target_s[1]

    def copy(self) -> "CostModel":
        """An independent copy (a policy updates its costs as it runs)."""
        return CostModel(dict(self.target_s), dict(self.drafter_s), dict(self.sync_s))

    def to_dict(self) -> dict:
        return {"target_s": {str(k): v for k, v in self.target_s.items()},
                "drafter_s": dict(self.drafter_s), "sync_s": dict(self.sync_s)}

    @classmethod
    def from_dict(cls, data: dict) -> "CostModel":
        return cls({int(k): float(v) for k, v in data.get("target_s", {}).items()},
                   {k: float(v) for k, v in data.get("drafter_s", {}).items()},
                   {k: float(v) for k, v in data.get("sync_s", {}).items()})


def _average(old: float | None, new: float) -> float:
    return new if old is None else DECAY * old + (1 - DECAY) * new


class _Rates:
    """Per-position success rates: a prior plus exponentially weighted evidence.

    rate_i = (hits_i + w·prior_i) / (trials_i + w), so a few rounds move it
    away from the prior and old rounds fade (DECAY per observation). The prior
    of a position is the estimate of the one before it: a position never
    tested is assumed to behave like the last one that was.
    """

    def __init__(self, prior: float, weight: float):
        self.prior, self.weight = prior, weight
        self.hits: list[float] = []
        self.trials: list[float] = []

    def observe(self, position: int, hit: bool) -> None:
        while position >= len(self.trials):
            self.hits.append(0.0)
            self.trials.append(0.0)
        self.hits[position] = DECAY * self.hits[position] + (1.0 if hit else 0.0)
        self.trials[position] = DECAY * self.trials[position] + 1.0

    def age(self, factor: float) -> None:
        self.hits = [h * factor for h in self.hits]
        self.trials = [t * factor for t in self.trials]

    def estimates(self, k: int, optimism: float = 0.0, prior: float | None = None) -> list[float]:
        """Rates of positions 0..k-1, plus ``optimism`` standard errors (capped at 1).

        ``prior`` replaces the prior of position 0 (see ``AcceptanceTracker.parent``).
        """
        result, prior = [], self.prior if prior is None else prior
        for i in range(k):
            trials = self.trials[i] if i < len(self.trials) else 0.0
            hits = self.hits[i] if i < len(self.hits) else 0.0
            n = trials + self.weight
            mean = (hits + self.weight * prior) / n
            result.append(min(1.0, mean + optimism * math.sqrt(mean * (1 - mean) / n)))
            prior = mean
        return result


class AcceptanceTracker:
    """What a drafter's rounds yield, per draft position.

    Two rates per position i: whether the drafter offers a token there at all
    (a draft model stops early when its own top probability is low), and
    whether the target accepts it, given the drafts before it were accepted.
    """

    def __init__(self, prior: float, offer_prior: float = 1.0,
                 parent: "AcceptanceTracker | None" = None, offer_parent: _Rates | None = None):
        self.accept = _Rates(prior, PRIOR_WEIGHT)
        self.offer = _Rates(offer_prior, OFFER_WEIGHT)
        # A tracker pooled over related keys (all prompt-lookup match lengths): its
        # estimate pulls this one's prior, so that when lookup copies well in this
        # content, short matches are tried too.
        self.parent = parent
        # A rate whose estimate is the prior of the offer rate (the target's confidence).
        self.offer_parent = offer_parent

    def _accept(self, k: int, optimism: float) -> list[float]:
        prior = None
        if self.parent is not None:
            prior = (self.accept.prior + self.parent.accept.estimates(1)[0]) / 2
        return self.accept.estimates(k, optimism, prior)

    def _offers(self, k: int, optimism: float) -> list[float]:
        prior = None if self.offer_parent is None else self.offer_parent.estimates(1)[0]
        return self.offer.estimates(k, optimism, prior)

    def update(self, drafted: int, accepted: int, stopped: bool = False) -> None:
        """A round that drafted ``drafted`` tokens (``stopped``: it wanted to draft
        more but stopped for low confidence) of which ``accepted`` were accepted."""
        for i in range(drafted):
            self.offer.observe(i, True)
        if stopped:
            self.offer.observe(drafted, False)
        # Positions after the first rejection were never tested: leave them alone.
        for i in range(min(drafted, accepted + 1)):
            self.accept.observe(i, i < accepted)

    def age(self, factor: float | None = None) -> None:
        """Trust the evidence a little less (the drafter was not tried this round)."""
        factor = AGING if factor is None else factor
        self.accept.age(factor)
        self.offer.age(factor)

    @property
    def alpha(self) -> list[float]:
        """The acceptance estimates of the positions tested so far."""
        return self._accept(len(self.accept.trials), 0.0)

    def expected_tokens(self, k: int, optimism: float = 0.0) -> float:
        """E(k): committed tokens of a round of up to k drafts (the +1 is the target's own)."""
        total, reach = 1.0, 1.0
        for a, g in zip(self._accept(k, optimism), self._offers(k, optimism)):
            reach *= a * g
            total += reach
        return total

    def expected_speeds(self, k_max: int, c: float, v, overhead: float = 0.0,
                        optimism: float = 0.0) -> list[float]:
        """Committed tokens per plain step of a round of up to k drafts, for k = 1..k_max.

        The drafter runs while it offers tokens (c per step, the first always);
        the target verifies what was offered, v(1 + n) (a plain step when n = 0).
        ``overhead``: a catch-up the round pays first, in plain steps.
        """
        accepts, offers = self._accept(k_max, optimism), self._offers(k_max, optimism)
        speeds = []
        tokens, reach = 1.0, 1.0     # E(k) so far; P(positions 0..k-1 all accepted)
        spent, through = overhead + c, 1.0  # cost of the rounds that stopped before k; P(offered 0..k-1)
        for k in range(1, k_max + 1):
            n = k - 1  # the position this k adds
            reach *= accepts[n] * offers[n]
            tokens += reach
            spent += through * (1.0 - offers[n]) * v(1 + n)  # it stopped at position n
            through *= offers[n]
            speeds.append(tokens / (spent + through * v(1 + k)))
            spent += through * c  # the drafter step for position k, if k grows
        return speeds

    def expected_speed(self, k: int, c: float, v, overhead: float = 0.0,
                       optimism: float = 0.0) -> float:
        """Committed tokens per plain step of a round of up to k drafts."""
        return self.expected_speeds(k, c, v, overhead, optimism)[-1]


@dataclass
class Plan:
    """What the next round does: a drafter and how many drafts (0: plain step).

    ``probe`` marks a round that is expected to lose on the estimates so far
    but is tried because they are still unsure (it may win).
    """

    drafter: str | None
    num_draft: int
    expected_speed: float
    probe: bool = False


PLAIN = Plan(None, 0, 1.0)


class AdaptivePolicy:
    """Chooses, before each round, the drafter and k that maximise E / (k·c + v(k+1)).

    Decisions use an optimistic α (the estimate plus ``optimism`` standard
    errors): a drafter that might pay is tried until the evidence says it
    does not, and evidence ages while a drafter is not tried, so it gets
    tried again now and then. Lookup rounds are tracked by match length.
    """

    def __init__(self, cost: CostModel | None = None, *, max_draft: int = MAX_DRAFT,
                 optimism: float | None = None, priors: dict[str, float] | None = None):
        self.cost = cost or CostModel()
        self.max_draft = max_draft
        self.optimism = OPTIMISM if optimism is None else optimism
        self.priors = {**LOOKUP_PRIORS, **(priors or {})}
        self.trackers: dict[str, AcceptanceTracker] = {}
        # How often the target is itself confident (top probability at least the draft
        # model's threshold) about the tokens it commits. It is known for every token at
        # no cost and follows the draft model's offer rate closely (bench prompts, 0.5B
        # drafter at 0.8: 0.86 vs 0.84 offered on code, 0.49 vs 0.38 on chat), so it is
        # that rate's prior: in text the target finds hard, a draft model is not asked
        # over and over to learn that it is unsure too.
        self.confidence = _Rates(CONFIDENCE_PRIOR, CONFIDENCE_WEIGHT)

    def tracker(self, name: str) -> AcceptanceTracker:
        if name not in self.trackers:
            if name.startswith("lookup:"):
                self.trackers[name] = AcceptanceTracker(
                    self.priors.get(name, MODEL_PRIOR), parent=self.tracker("lookup"))
            elif name == "lookup":
                self.trackers[name] = AcceptanceTracker(LOOKUP_POOLED_PRIOR)
            else:
                self.trackers[name] = AcceptanceTracker(self.priors.get(name, MODEL_PRIOR), OFFER_PRIOR,
                                                        offer_parent=self.confidence)
        return self.trackers[name]

    def best_k(self, name: str, limit: int, cost_name: str | None = None, *,
               behind: int = 0, optimism: float = 0.0) -> tuple[int, float]:
        """The k (1..limit) with the highest expected speed, and that speed.

        ``behind``: tokens the drafter must catch up on first (after plain steps).
        """
        cost_name = cost_name or name
        tracker, c = self.tracker(name), self.cost.c(cost_name)
        # A draft model that sat out plain steps first catches up on them (batched).
        overhead = behind * self.cost.sync(cost_name) if behind > 2 else 0.0
        k_max = min(limit, self.max_draft)
        if k_max < 1:
            return 0, 1.0
        v = [0.0] + [self.cost.v(n) for n in range(1, k_max + 2)]
        speeds = tracker.expected_speeds(k_max, c, v.__getitem__, overhead, optimism)
        k = int(np.argmax(speeds)) + 1
        return (k, speeds[k - 1]) if speeds[k - 1] > 1.0 else (0, 1.0)

    def _plan(self, key: str, drafter: str, limit: int, behind: int = 0) -> Plan:
        """The plan for tracker ``key``, with the costs of ``drafter``."""
        k, speed = self.best_k(key, limit, drafter, behind=behind)
        if k and speed >= MIN_GAIN:
            return Plan(drafter, k, speed)
        k, hope = self.best_k(key, limit, drafter, behind=behind, optimism=self.optimism)
        if k and hope >= PROBE_GAIN:
            return Plan(drafter, k, speed, probe=True)
        self.tracker(key).age()
        return PLAIN

    def plan_lookup(self, match_length: int, available: int, limit: int) -> Plan:
        """How much of a prompt-lookup proposal to verify (0: not worth it)."""
        return self._plan(lookup_key(match_length), "lookup", min(available, limit))

    def plan_model(self, name: str, limit: int, behind: int = 0) -> Plan:
        """Whether to draft with a draft model ``behind`` tokens out of date, and how far."""
        return self._plan(name, name, limit, behind)

    def observe_confidence(self, confident: Sequence[bool]) -> None:
        """Learn whether the target was confident about each token it committed."""
        for flag in confident:
            self.confidence.observe(0, flag)

    def observe_round(self, name: str, drafted: int, accepted: int, stopped: bool = False) -> None:
        """Learn from a round (``stopped``: the drafter stopped short of the plan)."""
        self.tracker(name).update(drafted, accepted, stopped)
        if name.startswith("lookup:"):
            self.tracker("lookup").update(drafted, accepted)


def lookup_key(match_length: int) -> str:
    """Prompt lookup's acceptance is tracked per match length (2, 3, 4-7, 8+)."""
    bucket = 8 if match_length >= 8 else 4 if match_length >= 4 else max(match_length, 2)
    return f"lookup:{bucket}"


# -- calibration -------------------------------------------------------------------


def calibration_key(target: Backend, draft: Backend | None) -> str:
    """Identifies a model pair on this machine, for the calibration cache."""
    parts = [platform.node(), platform.machine(), platform.processor()]
    for backend in (target, draft):
        if backend is None:
            continue
        path = getattr(backend, "path", None)
        size = os.path.getsize(path) if path and os.path.exists(path) else 0
        parts += [type(backend).__name__, str(path or backend.name), str(size),
                  str(getattr(backend, "n_threads", "")), str(getattr(backend, "n_gpu_layers", ""))]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def calibrate(target: Backend, drafts: Sequence[tuple[str, Backend]], *,
              sizes: Sequence[int] = CALIBRATION_SIZES, repeats: int = 3) -> CostModel:
    """Time target passes of ``sizes`` tokens, one-token drafter steps and a
    drafter's batched catch-up.

    Takes the fastest of ``repeats`` passes (the least disturbed by other
    work) and makes v(n) non-decreasing in n. Runs on a short dummy context
    and rewinds it: the caches are left empty.
    """
    cost = CostModel()
    token = 0 if target.vocab.bos_token_id is None else target.vocab.bos_token_id
    context = [token] * 16

    def timed(backend: Backend, n: int) -> float:
        backend.rewind(0)
        backend.forward(context, last_only=True)
        samples = []
        for _ in range(repeats + 1):  # the first pass warms up
            start = time.perf_counter()
            backend.forward([token] * n)
            samples.append(time.perf_counter() - start)
            backend.rewind(len(context))
        backend.rewind(0)
        return float(min(samples[1:]))

    slowest = 0.0
    try:
        for n in sorted(sizes):
            slowest = max(slowest, timed(target, n))  # a longer pass never costs less
            cost.target_s[n] = slowest
        for name, backend in drafts:
            cost.drafter_s[name] = timed(backend, 1)
            cost.sync_s[name] = timed(backend, SYNC_SIZE) / SYNC_SIZE
    finally:  # also when interrupted: no dummy tokens stay behind
        target.rewind(0)
        for _, backend in drafts:
            backend.rewind(0)
    return cost


def calibration_path(target: Backend, draft: Backend | None):
    """Where the costs of this pair on this machine are cached."""
    from .models import edgespec_home
    return edgespec_home() / "calibration" / f"{calibration_key(target, draft)}.json"


def load_or_calibrate(target: Backend, drafts: Sequence[tuple[str, Backend]]) -> CostModel:
    """The cached calibration of this pair on this machine, or a new one (then cached)."""
    path = calibration_path(target, drafts[0][1] if drafts else None)
    try:
        cost = CostModel.from_dict(json.loads(path.read_text()))
        if 1 in cost.target_s and all(name in cost.drafter_s and name in cost.sync_s
                                      for name, _ in drafts):
            return cost
    except (OSError, ValueError):
        pass
    cost = calibrate(target, drafts)
    save_calibration(cost, path)
    return cost


def save_calibration(cost: CostModel, path) -> None:
    from pathlib import Path
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(cost.to_dict()))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home only costs a calibration next time
