"""Auto mode, assembled: a planner over prompt lookup and a drafter, starting from
this pair's costs on this machine, which it keeps for the next run when it closes.

:class:`AutoPlanners` is the source of planners an engine is handed (``edgespec.load``
and the server build the engine with one): one auto planner per drafter, kept across
generations, fixed-k planners as asked, the long passes a planner wants timed timed
here (between generations, through the engine's cache), and every planner's costs
saved when it closes. :func:`auto_planner` is the one assembly, for the scripts and
tests that build an auto planner of their own.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from ..core.backend import Backend
from ..core.cache import CachedModel
from ..core.draft import MODEL, Drafter
from ..core.planner import AUTO, FixedPlanner, Planner, check_num_draft
from ..drafters import PromptLookup
from .adaptive import AdaptivePlanner, auto_drafters
from .calibration import PassTimer, borrowed_prior, cached_prior, pair_path, prior_for
from ..core.config import PlannerConfig
from .costs import CostModel

# The context the long passes are timed after where the cache is empty.
_TIMING_CONTEXT = 16


class AutoPlanners:
    """The planners of one engine: auto mode's, one per drafter (kept, so a chat learns
    what its drafters are worth once, not every turn), and fixed-k ones.

    ``config``: the tunables of every auto planner made (None: each its default, with a
    draft model's own stop kept); ``prior``: costs to start from instead of this pair's
    cached ones (then nothing is saved); ``min_draft``: no planner verifies a shorter
    draft (--draft-min)."""

    def __init__(self, config: PlannerConfig | None = None, *, prior: dict | None = None,
                 min_draft: int = 0):
        self.config, self.prior, self.min_draft = config, prior, min_draft
        self._auto: dict[int, tuple[Drafter | None, AdaptivePlanner]] = {}
        # A server's: a planner made inside a request is not timed there (a calibration
        # costs seconds and its own passes through the target's cache); it starts from
        # what is kept, and is timed by time_pending() once the server is idle.
        self.defer = False
        self._pending: list[tuple[Drafter | None, AdaptivePlanner]] = []

    def planner(self, drafter: Drafter | None, num_draft: int | str, *,
                target: CachedModel, clock: Callable[[], float] = time.perf_counter) -> Planner:
        """The planner for ``drafter`` at ``num_draft`` (k, or ``"auto"``)."""
        check_num_draft(num_draft)
        if num_draft != AUTO:
            return FixedPlanner(drafter, num_draft, self.min_draft)
        kept = self._auto.get(id(drafter))
        if kept is not None and kept[0] is drafter:
            return kept[1]
        planner = auto_planner(target, drafter, self.config, prior=self.prior, calibrate=not self.defer)
        planner.min_draft = self.min_draft
        if self.defer:
            self._pending.append((drafter, planner))
        else:
            time_long_passes(planner, target, clock)
        self._auto[id(drafter)] = (drafter, planner)
        return planner

    @property
    def pending(self) -> bool:
        """Whether a planner made meanwhile waits to be timed (:meth:`time_pending`)."""
        return bool(self._pending)

    def time_pending(self, target: CachedModel, clock: Callable[[], float] = time.perf_counter) -> None:
        """Time what the planners made since the last call were not timed for: their
        pair's calibration, if none is kept, and the long passes they want; after what
        the caches hold, which they hold again afterwards. (A server calls it when idle.)"""
        while self._pending:
            drafter, planner = self._pending.pop(0)
            models = _draft_models(drafter)
            if self.prior is None and cached_prior(target, models) is None:
                planner.cost.use_prior(prior_for(target, models, keep=True))
            time_long_passes(planner, target, clock)

    def close(self) -> None:
        """Close every auto planner made: each keeps what its runs measured for the next."""
        for _, planner in self._auto.values():
            planner.close()


def auto_planner(target: Backend | CachedModel, drafter: Drafter | None,
                 config: PlannerConfig | None = None, *, prior: dict | None = None,
                 cheap: Drafter | None = None, calibrate: bool = True) -> AdaptivePlanner:
    """Auto mode over a drafter that costs nothing to ask (``cheap``: prompt lookup
    unless given; a copying ``drafter`` takes its place) and ``drafter``, from this
    pair's cached costs, or a short calibration the first time (through ``target``,
    and the draft model's own cache); closing the planner keeps what its run measured
    for the next. With a ``prior`` (a benchmark's or a script's own costs) it starts
    from those and keeps nothing. Without ``calibrate``, a pair with no costs kept
    starts from the target's costs as kept for another drafter (or none:
    :func:`~edgespec.planner.calibration.borrowed_prior`) instead of a calibration.

    A draft model with a stop of its own (``min_confidence``: the user's
    --draft-p-min) keeps it; otherwise it stops below the planner's ``draft_p_min``
    top probability at first, and the planner then moves the stop
    (:class:`~edgespec.planner.StopRule`).
    """
    models = _draft_models(drafter)
    if config is None:
        chosen = drafter.min_confidence if models else 0.0
        config = PlannerConfig(draft_p_min=chosen, learn_stop=False) if chosen else PlannerConfig()
    if cheap is None:
        cheap = PromptLookup()
        cheap.attach(target.backend if isinstance(target, CachedModel) else target)
    kept = pair_path(target, models) if prior is None else None
    if prior is None:
        prior = prior_for(target, models) if calibrate else \
            cached_prior(target, models) or borrowed_prior(target)
    return AdaptivePlanner(auto_drafters(drafter, cheap), CostModel(prior, config), config,
                           keep_costs=kept)


def time_long_passes(planner: AdaptivePlanner, target: CachedModel,
                     clock: Callable[[], float] = time.perf_counter) -> None:
    """Time the pass sizes ``planner`` wants and has no cost for (:meth:`~AdaptivePlanner.
    timing_wanted`), as a round's pass runs, each after a one-token pass timed alike and
    one more after the last (:class:`~edgespec.planner.calibration.PassTimer`), after what
    ``target`` holds, which it holds again afterwards. Once per machine and pair: what is
    timed is kept with the planner's costs."""
    wanted = planner.timing_wanted()
    if not wanted:
        return
    kept = len(target.tokens)
    sizes = PassTimer.sizes(wanted, 2 * (sum(wanted) + len(wanted) + 2))  # (all of them)
    vocab = target.backend.vocab
    token = 0 if vocab.bos_token_id is None else vocab.bos_token_id
    start = kept if kept + sum(sizes) + 1 < target.backend.n_ctx else 0
    if start == 0:  # (no room after the cached text: time after a short one of its own)
        target.rewind(0)
        target.sync([token] * _TIMING_CONTEXT, need_logits=False)
    timer = PassTimer(target, clock)
    try:
        for n in sizes:
            planner.observe_pass(n, timer.time([token] * n))
    finally:
        target.rewind(kept if start else 0)


def costs_path(target: Backend | CachedModel, drafter: Drafter | None) -> Path:
    """Where the costs of this pair on this machine are kept."""
    return pair_path(target, _draft_models(drafter))


def _draft_models(drafter: Drafter | None) -> list[tuple[str, CachedModel]]:
    """The draft model to time with the target, by the cache it drafts through."""
    cache = drafter.cache if drafter is not None and drafter.kind == MODEL else None
    return [(drafter.name, cache)] if cache is not None else []
