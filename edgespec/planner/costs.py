"""What passes cost on this machine: measured, robust, and never stale for long.

All costs are ratios to one one-token target pass (a *plain step*), as the
speed model needs them (docs/design.md):

- ``v(n)``: a target pass over n tokens (the verify of n - 1 drafts, with the
  host work of turning its rows into a verdict);
- ``c(drafter)``: one drafter step (drafting one token);
- ``catch_up(drafter, n)``: a draft model's batched pass over n committed
  tokens after it sat out some rounds, taken as c·v(n) (a smaller model of the
  same kind batches about as the target does).

The :class:`CostModel` keeps the last few samples of each and estimates by
their median (by the smaller of the first two: a warm-up or a busy moment
only ever makes a pass slower), as
a ratio to the median plain step of the same window, so that a machine that
gets busier or faster changes both sides alike. Estimates are clamped to what
is physically plausible (1 <= v(n) <= n, 0 <= c <= 1). A *prior*
(the cached calibration of this model pair, or a bench profile) only stands in
until this run has measured the same thing. A pass size timed fewer than three
times takes the prior's value at this run's level (what all its timed passes
say of the prior as a whole), so that one busy pass does not make one size look
dear for a whole run; a drafter's step up to 1.5 times dearer than its prior
needs three samples to outweigh it (so that one cold first step cannot lock a
drafter out). What a
run saves for the next is surer than that: the prior counts as a few samples
beside this run's, and a size this run did not time keeps the prior's value.

What is measured is kept between runs by :mod:`edgespec.planner.calibration`.
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import Sequence

from ..core.config import DEFAULT_CONFIG, PlannerConfig


class _Samples:
    """The most recent samples of one kind, and when the newest was taken."""

    def __init__(self, window: int) -> None:
        self.values: deque[float] = deque(maxlen=window)
        # Each value over the plain step of its moment (None: none measured yet), which is
        # what a run saves: a ratio to plain steps timed around it, not to the run's last.
        self.ratios: deque[float | None] = deque(maxlen=window)
        self.last_tick = -1  # the CostModel's clock at the newest sample
        self._estimate: float | None = None  # of the values as they are (the planner asks often)

    def add(self, value: float, tick: int, step: float | None = None) -> None:
        if value >= 0:
            self.values.append(value)
            self.ratios.append(value / step if step else None)
            self.last_tick = tick
            self._estimate = None

    def estimate(self) -> float | None:
        """The typical sample (see :func:`_typical`); None before the first."""
        if self._estimate is None and self.values:
            self._estimate = _typical(self.values)
        return self._estimate


def _typical(values) -> float:
    """The median; of one or two values the smaller, since a pass is never faster
    than the machine but often slower (a warm-up, a busy moment)."""
    return min(values) if len(values) <= 2 else statistics.median(values)


class CostModel:
    """Costs of target passes and drafter steps, in plain steps (see module doc).

    ``prior`` holds ratios (``{"v": {n: v(n)}, "c": {name: c}}``),
    e.g. :func:`~edgespec.planner.calibration.load_calibration`'s; it stands in until this run has measured
    the same quantity (a few times: see the module doc). ``config``: its tunables
    (``cost_window``, ``trusted_samples``, ``cold_start``, ``confirmed``, ...).
    """

    def __init__(self, prior: dict | None = None, config: PlannerConfig = DEFAULT_CONFIG):
        self.config = config
        prior = prior or {}
        self.prior_v = {int(n): _clamp(float(r), 1.0, float(n))
                        for n, r in prior.get("v", {}).items() if int(n) >= 1}
        self.prior_c = {k: _clamp(float(r), 0.0, 1.0) for k, r in prior.get("c", {}).items()}
        self._target: dict[int, _Samples] = {}
        self._step: dict[str, _Samples] = {}
        self._v_table: dict[int, float] | None = None
        self._points: dict[int, float] | None = None  # v(m) at every size known (_known_v)
        self._sure: dict[int, float] = {}  # v(m) at the sizes timed surely (_sure_v)
        self.tick = 0  # target passes observed: the clock that ages samples

    def use_prior(self, prior: dict) -> None:
        """Stand on ``prior`` from now on (a calibration made after the run began), in
        place of the one given: what this run measured stays as it is."""
        fresh = CostModel(prior, self.config)
        self.prior_v, self.prior_c = fresh.prior_v, fresh.prior_c
        self._v_table = self._points = None

    # -- measurements ------------------------------------------------------------------

    def observe_target(self, num_tokens: int, seconds: float) -> None:
        """A target pass over ``num_tokens`` tokens (verify included) took ``seconds``."""
        self.tick += 1
        step = self.step_seconds if num_tokens > 1 else None
        self._target.setdefault(num_tokens, _Samples(self.config.cost_window)).add(seconds, self.tick, step)
        self._v_table = self._points = None

    def observe_draft(self, name: str, steps: int, seconds: float) -> None:
        """``steps`` drafter steps took ``seconds``."""
        if steps > 0:
            self._step.setdefault(name, _Samples(self.config.cost_window)).add(seconds / steps, self.tick, self.step_seconds)

    @property
    def step_seconds(self) -> float | None:
        """The median plain step of this run, in seconds (None before one was measured)."""
        samples = self._target.get(1)
        return samples.estimate() if samples else None

    def rounds_since_measured(self, drafter: str) -> float:
        """Target passes since this run last measured both a verify pass (n > 1)
        and a step of ``drafter``: how long the estimates for it have rested on
        older numbers (infinite: never measured in this run)."""
        verify = max((s.last_tick for n, s in self._target.items() if n > 1 and s.values), default=-1)
        own = self._step.get(drafter)
        last = min(verify, own.last_tick if own and own.values else -1)
        return float("inf") if last < 0 else float(self.tick - last)

    def rounds_since_plain_step(self) -> float:
        """Target passes since this run last measured a plain step (infinite: never)."""
        samples = self._target.get(1)
        return float(self.tick - samples.last_tick) if samples and samples.values else float("inf")

    def plain_steps_measured(self) -> int:
        """How many plain steps the window holds."""
        samples = self._target.get(1)
        return len(samples.values) if samples else 0

    def measured_sizes(self) -> list[int]:
        """Target pass sizes this run has measured."""
        return sorted(n for n, s in self._target.items() if s.values)

    def trusted_sizes(self) -> list[int]:
        """Pass sizes whose cost is known here: those this run measured, and the prior's
        once this run's verify passes have confirmed it (their typical ratio to it within
        ``confirmed`` of 1, over at least two passes): a prior that claims wide passes are
        cheap, wrongly, is not believed for the sizes this run has not tried."""
        sizes = self.measured_sizes()
        step = self.step_seconds
        if not step or not self.prior_v:
            return sizes
        ratios = [seconds / step / self.prior_v[n] for n in sizes if n > 1 and n in self.prior_v
                  for seconds in self._target[n].values]
        confirmed = self.config.confirmed
        if len(ratios) >= 2 and 1 / confirmed <= _typical(ratios) <= confirmed:
            return sorted(set(sizes) | set(self.prior_v))
        return sizes

    # -- estimates -----------------------------------------------------------------------

    def v(self, n: int) -> float:
        """Time of an n-token target pass / time of a one-token pass."""
        if n <= 1:
            return 1.0
        if self._v_table is None:
            self._v_table = {}
        if n not in self._v_table:
            self._v_table[n] = self._estimate_v(n)
        return self._v_table[n]

    def _estimate_v(self, n: int) -> float:
        if self._points is None:  # once per new sample (not per n)
            self._points, self._sure = self._known_v(), self._sure_v()
        points = self._points
        return min(self._from_points(n, points), self._envelope(n))

    def _from_points(self, n: int, points: dict[int, float]) -> float:
        if n in points:
            # A size timed here or in the prior stands as timed (or scaled to this run's
            # level), within v(n/2) <= v(n) <= n, even below a slightly shorter one:
            # llama.cpp's repacked CPU kernels multiply rows in groups of 4, so a 4-token
            # pass can cost less than a 3-token one, though never less than one of half
            # as many tokens.
            return _clamp(points[n], self.v(n // 2) if n >= 4 else 1.0, float(n))
        ratio = self._between(n, points) if len(points) > 1 else float(n)  # (nothing known:
        # assume no batching gain at all.) Otherwise a longer pass is taken to cost no
        # less than a shorter one. Past the largest known size the estimate grows with n by
        # construction, so the floor is the value there (a catch-up over a hundred tokens
        # does not build a table of a hundred entries).
        floor = self.v(min(n - 1, max(points))) if n > 2 else 1.0
        return _clamp(ratio, floor, float(n))

    def _envelope(self, n: int) -> float:
        """The most an n-token pass can cost by what this run timed surely
        (:meth:`_sure_v`): no more than the ⌈n/m⌉ passes of m tokens it could be split
        into, and no more than a pass longer by a tile of 4 rows or more (within a tile a
        shorter pass may cost more: repacked kernels). So a belief from the prior that a
        size is dear, which no run would test again (drafts of that size look unprofitable,
        so they are not made, so it is not timed), gives way to what this run's passes
        say; a size timed surely here is its own measure."""
        sure = self._sure
        if n in sure or not sure:
            return float(n)
        bounds = [-(-n // m) * v for m, v in sure.items() if m < n] + \
            [v for m, v in sure.items() if m >= n + 4]
        return max(1.0, min(bounds)) if bounds else float(n)

    def _sure_v(self) -> dict[int, float]:
        """v(m) at the sizes this run timed at least ``trusted_samples`` times (their own
        median over the plain step)."""
        step = self.step_seconds
        if not step:
            return {}
        return {m: _typical(s.values) / step for m, s in self._target.items()
                if m > 1 and len(s.values) >= self.config.trusted_samples}

    def _known_v(self) -> dict[int, float]:
        """v at every size known: what this run timed (:meth:`_timed_v`), and the
        prior's other sizes at this run's level near them. That level is what the
        sizes this run timed say of the prior there, interpolated between the nearest
        such sizes below and above (the nearest one, past them; none: the prior as it
        is), so the prior's shape survives (the saw-tooth of repacked kernels) and one
        noisy short pass does not move the long ones as a line through it would (a
        2-token pass timed 20% dear would make a 5-token pass look 40% dear)."""
        measured = self._timed_v()
        anchors = sorted(m for m in measured if m in self.prior_v)
        scale = {m: measured[m] / self.prior_v[m] for m in anchors}
        points = {1: 1.0}
        for m, ratio in self.prior_v.items():
            below = [a for a in anchors if a <= m]
            above = [a for a in anchors if a >= m]
            if below and above and below[-1] != above[0]:
                lo, hi = below[-1], above[0]
                level = scale[lo] + (m - lo) / (hi - lo) * (scale[hi] - scale[lo])
            elif below and not above and self.prior_v[below[-1]] <= 1.0:
                # A prior that claims batching is free has no shape to scale: past what
                # this run timed, the line through (1, 1) and the largest size it timed.
                top = below[-1]
                points[m] = 1.0 + (measured[top] - 1.0) / (top - 1) * (m - 1)
                continue
            else:
                level = scale[below[-1]] if below else scale[above[0]] if above else 1.0
            points[m] = ratio * level
        points.update(measured)
        return points

    def _timed_v(self) -> dict[int, float]:
        """v(m) at the sizes this run timed: a size's own median once it was timed
        ``trusted_samples`` times (or where the prior lacks it); before that, the prior's
        value at this run's level, the typical ratio of all the verify passes it timed
        to the prior's value for their sizes. One pass on a busy moment then moves
        every size a little instead of its own a lot (it would make drafts of that
        size look dear, and so untried, for the rest of a generation)."""
        step = self.step_seconds
        if not step:
            return {}
        timed = {m: self._target[m].values for m in self.measured_sizes() if m > 1}
        to_prior = [seconds / step / self.prior_v[m]
                    for m, values in timed.items() if m in self.prior_v for seconds in values]
        level = _typical(to_prior) if to_prior else None
        return {m: self.prior_v[m] * level if m in self.prior_v and len(values) < self.config.trusted_samples
                else _typical(values) / step for m, values in timed.items()}

    @staticmethod
    def _between(n: int, points: dict[int, float]) -> float:
        """v(n) from known ``points`` (n not among them): on the line between the two
        nearest; past the largest, on the line through (1, 1) and it."""
        sizes = sorted(points)
        below = max(s for s in sizes if s <= n)
        above = [s for s in sizes if s >= n]
        if above:
            hi = above[0]
            return points[below] + (n - below) / (hi - below) * (points[hi] - points[below])
        top = sizes[-1]
        return 1.0 + (points[top] - 1.0) / (top - 1) * (n - 1) if top > 1 else float(n)

    def c(self, name: str) -> float:
        """Time of one drafter step / time of one plain step."""
        step, own = self.step_seconds, self._step.get(name)
        prior = self.prior_c.get(name)
        if step and own and own.values:
            measured = _clamp(own.estimate() / step, 0.0, 1.0)
            # A drafter's first step runs cold (its weights out of the CPU's caches), and
            # a drafter judged too dear is not asked again: one slow step would lock it
            # out. Until a median exists, a step up to ``cold_start`` times the prior counts
            # as cold and the prior stands; one further off (a stale or poisoned prior)
            # replaces it at once.
            if prior is not None and len(own.values) < self.config.trusted_samples \
                    and prior < measured <= self.config.cold_start * prior:
                return prior
            return measured
        # Never measured: assume it is cheap, so that it gets tried, and measured.
        return 0.0 if prior is None else prior

    def catch_up(self, name: str, tokens: int) -> float:
        """Time for a draft model to catch up on ``tokens`` committed tokens / one plain step."""
        return self.c(name) * self.v(tokens) if tokens > 0 else 0.0

    def as_prior(self, sizes: Sequence[int] | None = None) -> dict:
        """What the calibration file keeps, as ratios: for every pass size this run
        timed (and every drafter it timed), the median of its samples and the prior's
        value counted as ``cost_prior_weight`` samples; the prior's value for the sizes it
        did not time (of ``sizes``, default the calibration's, those known to neither are left out: the next run
        interpolates them itself).

        In a run, one sample replaces the prior; what outlives the run must be surer:
        a size that looks dear is not timed again, so one or two passes timed on a
        busy moment, saved as they were, would become every later run's belief. And
        never an estimate derived for a size this run did not time: scaled again run
        after run, such a value would drift without a single measurement behind it.
        """
        step, cfg = self.step_seconds, self.config
        sizes = cfg.calibration_sizes if sizes is None else sizes
        v = {n: self.prior_v.get(n) for n in (set(sizes) | set(self.prior_v)) - {1}}
        v[1] = 1.0
        c = dict(self.prior_c)
        if step:  # ratios need this run's plain step
            for n in self.measured_sizes():
                # The sizes a run may time on purpose (the calibration's, the long ones):
                # a draft of 23 or 63 tokens timed once or twice would stand as a point
                # of its own in every later run, right or not.
                if 1 < n and (n in cfg.saved_sizes or n in sizes or n in self.prior_v):
                    v[n] = _saved(self._target[n], step, self.prior_v.get(n), 1.0, float(n),
                                  cfg.cost_prior_weight)
            for name, samples in self._step.items():
                if samples.values:
                    c[name] = _saved(samples, step, self.prior_c.get(name), 0.0, 1.0,
                                     cfg.cost_prior_weight)
        return {"v": {str(n): v[n] for n in sorted(v) if v[n] is not None},
                "c": c,
                "step_seconds": step}


def _saved(samples: _Samples, step: float, prior: float | None, low: float, high: float,
           prior_weight: int) -> float:
    """What a run keeps of one cost: the median of its samples, each as a ratio to the
    plain step of its moment (else to the run's ``step``), and ``prior`` counted as
    ``prior_weight`` samples, within [low, high]."""
    ratios = [ratio if ratio is not None else seconds / step
              for seconds, ratio in zip(samples.values, samples.ratios)]
    return _clamp(statistics.median(ratios + ([prior] * prior_weight if prior is not None else [])),
                  low, high)


def _clamp(value: float, low: float, high: float) -> float:
    return min(max(value, low), high)
