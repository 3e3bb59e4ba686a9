"""Adaptive speculation: pick the drafter and k each round, or decode plainly.

Expected speed of a round, in tokens per plain target step (DESIGN.md):

    S(k) = E(k) / (k·c + v(k+1)),   E(k) = 1 + Σ_{j=1..k} Π_{i<=j} α_i

where c is the drafter's step cost, v(n) the target's n-token pass, both in
units of a one-token target pass, and α_i the probability that draft position
i is accepted given the ones before it were. Plain decoding has S = 1. The
costs are measured (a short calibration at load, cached per model pair and
machine, then updated from every pass); α is tracked per drafter with an
exponentially weighted average, so it follows the content. When nothing
beats plain decoding, the engine decodes plainly and now and then probes a
short draft so that a change of content is noticed.

Choosing the proposal from past rounds only (never from the target's output
for the round being verified) keeps the acceptance rule exact.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .backends.base import Backend

MAX_DRAFT = 8             # the longest draft auto mode proposes
DECAY = 0.9               # weight of the past in the acceptance and cost averages
PROBE_EVERY = 48          # plain steps between two probes of a losing drafter
PROBE_K = 2
MIN_GAIN = 1.02           # speculate only when it is expected to beat plain by this much
AUTO_DRAFT_P_MIN = 0.5    # auto mode: a draft model stops below this top probability
CALIBRATION_SIZES = (1, 2, 3, 5, 9)


@dataclass
class CostModel:
    """Measured seconds of target passes and drafter steps, as running averages."""

    target_s: dict[int, float] = field(default_factory=dict)   # n tokens -> seconds per pass
    drafter_s: dict[str, float] = field(default_factory=dict)  # drafter -> seconds per draft token

    def observe_target(self, n: int, seconds: float) -> None:
        old = self.target_s.get(n)
        self.target_s[n] = seconds if old is None else DECAY * old + (1 - DECAY) * seconds

    def observe_drafter(self, name: str, tokens: int, seconds: float) -> None:
        if tokens <= 0:
            return
        per_token = seconds / tokens
        old = self.drafter_s.get(name)
        self.drafter_s[name] = per_token if old is None else DECAY * old + (1 - DECAY) * per_token

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

    def to_dict(self) -> dict:
        return {"target_s": {str(k): v for k, v in self.target_s.items()},
                "drafter_s": dict(self.drafter_s)}

    @classmethod
    def from_dict(cls, data: dict) -> "CostModel":
        return cls({int(k): float(v) for k, v in data.get("target_s", {}).items()},
                   {k: float(v) for k, v in data.get("drafter_s", {}).items()})


class AcceptanceTracker:
    """Exponentially weighted α_i per drafter (and per lookup match length)."""

    def __init__(self, prior: float):
        self.prior = prior
        self.alpha: list[float] = []

    def update(self, drafted: int, accepted: int) -> None:
        # Positions after the first rejection were never tested: leave them alone.
        for i in range(min(drafted, accepted + 1)):
            hit = 1.0 if i < accepted else 0.0
            if i >= len(self.alpha):
                self.alpha.append(self.prior)
            self.alpha[i] = DECAY * self.alpha[i] + (1 - DECAY) * hit

    def alpha_at(self, i: int) -> float:
        if i < len(self.alpha):
            return self.alpha[i]
        # Unseen positions: as the last seen one (acceptance rarely rises with depth).
        return self.alpha[-1] if self.alpha else self.prior

    def expected_tokens(self, k: int) -> float:
        """E(k): committed tokens of a round with k drafts (the +1 is the target's own)."""
        total, reach = 1.0, 1.0
        for i in range(k):
            reach *= self.alpha_at(i)
            total += reach
        return total


@dataclass
class Plan:
    """What the next round does: a drafter and how many drafts (0: plain step)."""

    drafter: str | None
    num_draft: int
    expected_speed: float
    probe: bool = False


class AdaptivePolicy:
    """Chooses, before each round, the drafter and k that maximise E / (k·c + v(k+1))."""

    def __init__(self, cost: CostModel | None = None, *, max_draft: int = MAX_DRAFT,
                 probe_every: int = PROBE_EVERY):
        self.cost = cost or CostModel()
        self.max_draft = max_draft
        self.probe_every = probe_every
        self.trackers: dict[str, AcceptanceTracker] = {}
        self.plain_since_probe: dict[str, int] = {}

    def tracker(self, name: str) -> AcceptanceTracker:
        if name not in self.trackers:
            self.trackers[name] = AcceptanceTracker(prior=_LOOKUP_PRIORS.get(name, 0.6))
        return self.trackers[name]

    def best_k(self, name: str, limit: int, cost_name: str | None = None) -> tuple[int, float]:
        """The k (1..limit) with the highest expected speed, and that speed."""
        tracker, c = self.tracker(name), self.cost.c(cost_name or name)
        best = (0, 1.0)
        for k in range(1, min(limit, self.max_draft) + 1):
            speed = tracker.expected_tokens(k) / (k * c + self.cost.v(k + 1))
            if speed > best[1]:
                best = (k, speed)
        return best

    def plan_lookup(self, match_length: int, available: int, limit: int) -> Plan:
        """How much of a prompt-lookup proposal to verify (0: not worth it)."""
        key = lookup_key(match_length)
        k, speed = self.best_k(key, min(available, limit), cost_name="lookup")
        if k and speed >= MIN_GAIN:
            self.plain_since_probe[key] = 0
            return Plan("lookup", k, speed)
        return self._probe_or_plain(key, min(available, limit), speed)

    def plan_model(self, name: str, limit: int) -> Plan:
        """Whether to draft with a draft model, and how far; probes now and then."""
        k, speed = self.best_k(name, limit)
        if k and speed >= MIN_GAIN:
            self.plain_since_probe[name] = 0
            return Plan(name, k, speed)
        return self._probe_or_plain(name, limit, speed)

    def _probe_or_plain(self, name: str, limit: int, speed: float) -> Plan:
        """A losing drafter gets a short probe now and then, so that a change of
        content (and so of acceptance) is noticed; otherwise decode plainly."""
        waited = self.plain_since_probe.get(name, 0) + 1
        self.plain_since_probe[name] = waited
        if waited >= self.probe_every and limit >= 1:
            self.plain_since_probe[name] = 0
            drafter = "lookup" if name.startswith("lookup") else name
            return Plan(drafter, min(PROBE_K, limit), speed, probe=True)
        return Plan(None, 0, 1.0)

    def observe_round(self, name: str, drafted: int, accepted: int) -> None:
        self.tracker(name).update(drafted, accepted)


# Prompt lookup's starting guesses by match length: a 2-token match is usually a
# coincidence, a 4-token one usually the start of a copy.
_LOOKUP_PRIORS = {"lookup:1": 0.15, "lookup:2": 0.25, "lookup:3": 0.4, "lookup:4": 0.6}


def lookup_key(match_length: int) -> str:
    """Prompt lookup's acceptance is tracked per match length: longer matches copy better."""
    return f"lookup:{min(match_length, 4)}"


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
    """Time target passes of ``sizes`` tokens and one-token drafter steps.

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
        if 1 in cost.target_s and all(name in cost.drafter_s for name, _ in drafts):
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
