"""Auto mode's planner: before each round, pick a drafter and k, or decode plainly.

Expected speed of a round, in tokens per plain target step (docs/design.md):

    S(k) = E(k) / (k·c + v(k+1)),   E(k) = 1 + Σ_{j=1..k} Π_{i<=j} α_i

where c is the drafter's step cost and v(n) the target's n-token pass, both in
plain steps (:mod:`edgespec.planner.costs` measures them in this run), and α_i the
probability that draft position i is accepted given the ones before it were
(:mod:`.estimates`). Plain decoding has S = 1. A draft model that sat out
some rounds must first catch up; that counts too.

Decisions add a little optimism, so a drafter that may pay is tried until the
evidence says otherwise; evidence ages while a drafter is not tried, so a losing
one is tried again now and then. The costs the decision rests on must be this
run's own: while a drafter's cost or the verify cost has not been measured
lately, it is retried (with a back-off that grows while retries lose), and a
plain step is taken now and then to keep the plain step's own cost fresh.
Every such try is paid from the exploration budget (:mod:`.budget`).

Choosing the proposal from past rounds only (never from the target's output for
the round being verified) keeps the acceptance rule exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from .calibration import save_calibration
from .costs import CostModel
from ..core.draft import COPY, MODEL, Drafter
from ..core.planner import DraftReport, Proposal, RoundResult
from .budget import ExplorationBudget
from ..core.config import PlannerConfig
from .estimates import AcceptanceTracker, Rates, StopRule


@dataclass
class _DrafterState:
    """What the planner remembers of one drafter across rounds."""

    behind: int = 0            # committed tokens since it last caught up
    since_retry: float = math.inf  # rounds since it was last retried
    retry_after: int = 0       # back-off between retries while its costs are unmeasured


class AdaptivePlanner:
    """Auto mode over a list of drafters (asked in order; the first whose draft
    pays wins the round), choosing k to maximise E / (k·c + v(k+1)).

    Keeps its estimates across generations: an engine (and so a chat) learns
    what its drafters are worth on this conversation once, not every turn.
    """

    def __init__(self, drafters: Sequence[Drafter], cost: CostModel | None = None,
                 config: PlannerConfig | None = None, *, keep_costs: Path | None = None):
        self.drafters = list(drafters)
        self.keep_costs = keep_costs  # where close() saves what this run measured, for the next
        self.cost = cost or CostModel()
        self.config = config or PlannerConfig()
        self.max_draft = self.config.max_draft
        self.min_draft = 0  # a shorter draft is not verified (--draft-min)
        self._kinds = {d.name: d.kind for d in self.drafters}
        # The target's confidence is a draft model's offer prior: over a 150k vocabulary
        # it costs a pass per committed token, so it is asked for only with one on offer.
        self.wants_confidence = MODEL in self._kinds.values()
        self.trackers: dict[str, AcceptanceTracker] = {}
        # How often the target is itself confident (top probability at least the draft
        # model's threshold) about the tokens it commits: known for every token it
        # commits, and close to how often the draft model offers a token at all, so it
        # is that rate's prior (a draft model is not asked over and over in hard text).
        self.confidence = Rates(self.config.confidence_prior, self.config.confidence_weight,
                                self.config.confidence_decay)
        self.stop = StopRule(self.config)
        self.stop_at = self.config.draft_p_min  # where draft models stop (set before each ask)
        self._state = {d.name: _DrafterState(retry_after=self.config.retry_after)
                       for d in self.drafters}
        self.budget = ExplorationBudget(self.config)
        # The round in flight, which a cancel must undo (begin() forgets it).
        self._asked: set[str] = set()  # drafters asked this round
        self._limit = 0  # the longest draft this round may verify

    @property
    def name(self) -> str:
        return "auto(" + "+".join(d.name for d in self.drafters) + ")"

    @property
    def exploration(self) -> float:
        """Plain steps that tries may still lose (the budget's balance)."""
        return self.budget.balance

    @exploration.setter
    def exploration(self, value: float) -> None:
        self.budget.balance = value

    def tracker(self, key: str) -> AcceptanceTracker:
        """The acceptance tracker of a drafter (``name``) or of one kind of its drafts
        (``name:bucket``)."""
        if key not in self.trackers:
            cfg = self.config
            name, _, bucket = key.partition(":")
            kind = self._kinds.get(name, MODEL)
            kind_prior = cfg.model_prior if kind == MODEL else cfg.copy_prior
            if bucket:  # priors are by the kind of drafter and of draft, never by name
                self.trackers[key] = AcceptanceTracker(
                    cfg, cfg.priors.get(f"{kind}:{bucket}", kind_prior),
                    later_lift=cfg.continuation_lift, parent=self.tracker(name))
            elif kind == MODEL:
                self.trackers[key] = AcceptanceTracker(cfg, cfg.model_prior, offer_parent=self.confidence,
                                                       weight=cfg.model_prior_weight)
            else:  # a copying drafter, which classes its drafts (prompt lookup)
                self.trackers[key] = AcceptanceTracker(cfg, cfg.copy_prior)
        return self.trackers[key]

    # -- the planner interface -------------------------------------------------------

    def begin(self, context: Sequence[int]) -> None:
        self._end_round()
        for state in self._state.values():
            state.behind = 0  # the engine prefilled every drafter

    def plan(self, context: Sequence[int], limit: int) -> Proposal | None:
        cost = self.cost
        if cost.plain_steps_measured() < 2 or cost.rounds_since_plain_step() > self.config.refresh_plain_after:
            return None  # measure the plain step now and then: every cost is relative to it
        # Measure before leaping: no pass more than about twice as long as any whose cost
        # is known (timed in this run, or in the prior once this run has confirmed it), so
        # a cached claim that long passes are cheap costs little if wrong.
        limit = self._limit = min(limit, self.max_draft, 2 * max(cost.trusted_sizes()))
        for drafter in self.drafters:
            if drafter.name in self._asked:
                continue
            self._asked.add(drafter.name)
            if cost.c(drafter.name) < self.config.cheap_drafter:
                return Proposal(drafter, limit)  # asking costs nothing: decide on the draft
            stop = None
            if drafter.kind == MODEL:  # where it stops, for this ask
                token_cost = cost.c(drafter.name) + (cost.v(limit + 1) - cost.v(1)) / limit
                alpha = self.tracker(drafter.name).alpha
                stop = self.stop_at = self.stop.threshold(
                    token_cost, alpha[0] if alpha else self.config.model_prior)
            k, probe, retry = self._decide(drafter.name, drafter.name, limit)
            if k:
                return Proposal(drafter, k, probe, min_confidence=stop, retry=retry)
        return None

    def review(self, report: DraftReport) -> Proposal | None:
        proposal, draft = report.proposal, report.draft
        name = proposal.drafter.name
        if not draft.token_ids:
            return None
        if draft.bucket is None:
            return replace(proposal, num_draft=len(draft)) if len(draft) >= self.min_draft else None
        key = f"{name}:{draft.bucket}"  # decide now that the kind of draft is known
        keep, probe, retry = self._decide(key, name, len(draft),
                                          draft.hold if self.config.copy_holds else None)
        if not keep or keep < self.min_draft or (self.config.compare_drafters and self._better_later(self.best_k(key, name, keep)[1])):
            return None
        return Proposal(proposal.drafter, keep, probe, retry=retry)

    def observe(self, result: RoundResult) -> None:
        cfg = self.config
        draft_cost, caught_up = 0.0, set()
        for report in result.reports:  # what the round's drafting cost, and taught
            name = report.proposal.drafter.name
            self._observe_draft_cost(name, report)
            draft_cost += self._typical_draft_cost(name, report)
            caught_up.add(name)
            if not report.draft.token_ids and self._stopped(report):
                self.tracker(name).update(0, 0, stopped=True)  # a draft model unsure of its first token
        self.cost.observe_target(result.target_tokens, result.target_seconds)
        self.confidence_update(result.target_top_probs)
        verified = result.verified.drafter.name if result.verified else None
        if verified is not None:
            report = result.reports[-1]  # the engine verifies the last draft it asked for
            stopped = self._stopped(report) and result.verified.num_draft == len(report.draft)
            self.tracker(verified).update(result.num_drafted, result.num_accepted, stopped)
            if result.bucket is not None:
                self.tracker(f"{verified}:{result.bucket}").update(result.num_drafted, result.num_accepted)
            if report.draft.confidence is not None:
                self.stop.observe(report.draft.confidence[:result.num_drafted], result.num_accepted)
        tried = [r.proposal for r in result.reports] + ([result.verified] if result.verified else [])
        self.budget.settle(result.num_committed, self.cost.v(result.target_tokens) + draft_cost
                           if any(p.probe for p in tried) else None)
        retried = {p.drafter.name for p in tried if p.retry}
        for drafter in self.drafters:
            state = self._state[drafter.name]
            if drafter.name == verified:  # it holds its accepted drafts: 1 or 2 tokens to go
                state.behind = 1 + (result.num_accepted == result.num_drafted)
            else:
                state.behind = (0 if drafter.name in caught_up else state.behind) + result.num_committed
            state.since_retry += 1
            if drafter.name in retried:  # back off further while retries lose (on typical costs)
                won = drafter.name == verified and \
                    result.num_committed > self.cost.v(result.target_tokens) + draft_cost
                state.retry_after = cfg.retry_after if won else min(2 * state.retry_after, cfg.retry_max)
        self._end_round()

    def _end_round(self) -> None:
        """Forget the round in flight (also one that a cancel or an error cut short:
        the next generation must not pay for it)."""
        self._asked.clear()

    def timing_wanted(self) -> Sequence[int]:
        """The long pass sizes (16, 32, 64 tokens, as far as the longest draft needs) that
        neither this run nor its prior has timed: the calibration times only short ones,
        and what a longer pass costs cannot be told from them (on one CPU v(16) ~ v(9),
        on another ~ 2 v(9)). :class:`~edgespec.planner.factory.AutoPlanners` times them
        where it makes the planner, and what is timed becomes the next run's prior when
        the planner closes."""
        known = set(self.cost.measured_sizes()) | set(self.cost.prior_v)
        return tuple(n for n in sorted(self.config.long_sizes, reverse=True) if n <= self.max_draft + 1 and n not in known)

    def observe_pass(self, num_tokens: int, seconds: float) -> None:
        self.cost.observe_target(num_tokens, seconds)

    def close(self) -> None:
        """Keep what this run measured as the next run's prior (where ``keep_costs``
        says, and if it measured)."""
        if self.keep_costs is not None and self.cost.step_seconds is not None:
            save_calibration(self.cost.as_prior(), self.keep_costs)

    def confidence_update(self, top_probs: np.ndarray) -> None:
        """Learn whether the target was confident about each token it committed."""
        for top in np.asarray(top_probs).reshape(-1):
            self.confidence.observe(0, bool(top >= self.stop_at))

    # -- decisions --------------------------------------------------------------------------

    def best_k(self, key: str, cost_name: str, limit: int, *, behind: int = 0,
               optimism: float = 0.0, hold: Sequence[float] | None = None) -> tuple[int, float]:
        """The k (1..limit) with the highest expected speed, and that speed. ``hold``: a
        copying drafter's own chance, per token of its draft, that it holds (then
        the tracker's rate stands for whether the copy starts at all)."""
        tracker, c = self.tracker(key), self.cost.c(cost_name)
        # A draft model that sat out rounds first catches up on them (batched).
        # It pays that once to draft for the rounds after it too: spread it over them.
        overhead = self._catch_up(cost_name, behind) / self.config.catch_up_rounds
        k_max = min(limit, self.max_draft)
        if k_max < 1:
            return 0, 1.0
        v = [0.0] + [self.cost.v(n) for n in range(1, k_max + 2)]
        speeds = tracker.expected_speeds(k_max, c, v.__getitem__, overhead, optimism, hold)
        k = max(range(k_max), key=speeds.__getitem__) + 1  # the first best, as np.argmax (cheaper on a list)
        return k, speeds[k - 1]

    def _better_later(self, speed: float) -> bool:
        """Whether a drafter not asked yet this round is expected to beat ``speed``."""
        for drafter in self.drafters:
            if drafter.name not in self._asked:
                behind = self._state[drafter.name].behind
                if self.best_k(drafter.name, drafter.name, self._limit, behind=behind)[1] > speed:
                    return True
        return False

    def _decide(self, key: str, name: str, limit: int,
                hold: Sequence[float] | None = None) -> tuple[int, bool, bool]:
        """How far drafter ``name`` should draft (tracked under ``key``; ``hold`` as for
        :meth:`best_k`), whether that is a probe, and whether a retry; (0, False, False)
        for not at all."""
        cfg, state = self.config, self._state[name]
        k, speed = self.best_k(key, name, limit, behind=state.behind, hold=hold)
        if speed >= cfg.min_gain:
            return k, False, False
        if self.budget.balance > 0:  # tries are paid from the exploration budget
            # Hope is for the drafter in step with the text: the catch-up a draft model owes
            # after sitting out (which grows with every token it misses) is not part of it,
            # or a model that pays in step would stay locked out; it is what the probe risks
            # instead (_affordable), so the budget bounds it.
            k, hope = self.best_k(key, name, limit, optimism=cfg.optimism, hold=hold)
            probe = self._affordable(name, k, state.behind) if hope >= cfg.probe_gain else 0
            if probe:
                return probe, True, False
            # The decision rests on costs this run has not measured (lately): retry now and
            # then, so that a wrong cached number is corrected instead of locking this off,
            # but only while a catch-up is cheap (a draft model that sat out long is not).
            if self.cost.rounds_since_measured(name) > cfg.stale_after \
                    and state.since_retry >= state.retry_after \
                    and self._catch_up(name, state.behind) <= cfg.retry_budget:
                state.since_retry = 0
                return k, True, True
        self.tracker(key).age()
        return 0, False, False

    def _affordable(self, name: str, k: int, behind: int) -> int:
        """The longest probe, up to ``k`` drafts, whose loss if every draft were
        rejected (a catch-up included) the exploration budget still covers; 0 if
        none: one probe that failed would leave nothing to try with for hundreds
        of tokens."""
        cost, overhead = self.cost, self._catch_up(name, behind)
        while k > 0 and overhead + k * cost.c(name) + cost.v(k + 1) - 1 > self.budget.balance:
            k -= 1
        return k

    def _catch_up(self, name: str, behind: int) -> float:
        """What a drafter ``behind`` committed tokens behind pays, in plain steps, before
        it drafts: nothing for the one or two tokens after a round it drafted in (its
        first drafting step takes them), a batched catch-up after sitting out."""
        return self.cost.catch_up(name, behind) if behind > 2 else 0.0

    def _stopped(self, report: DraftReport) -> bool:
        """Whether a draft model stopped short of what it was asked for (its confidence
        fell below the stop)."""
        return report.proposal.drafter.kind == MODEL and len(report.draft) < report.proposal.num_draft

    def _observe_draft_cost(self, name: str, report: DraftReport) -> None:
        """Drafter step and catch-up costs from a timed proposal."""
        steps = self._draft_steps(report)
        if report.caught_up > 2:  # a catch-up after sitting out: not a drafting step
            if steps > 1:
                self.cost.observe_draft(name, steps - 1, report.draft_seconds)
        else:  # the usual one or two tokens: the first drafting step
            if report.caught_up == 0 and report.proposal.drafter.kind == MODEL:
                # A draft model already in step (the engine prefilled it) has its first
                # token's row at hand: no step for it. Timed as one, a model unsure of
                # that token measured as free, and free drafters draft without a stop.
                steps -= 1
            self.cost.observe_draft(name, steps, report.catch_up_seconds + report.draft_seconds)

    def _typical_draft_cost(self, name: str, report: DraftReport) -> float:
        """What a proposal like ``report``'s typically costs, in plain steps: its
        drafting steps and, after sitting out, its catch-up."""
        steps, catch_up = self._draft_steps(report), self._catch_up(name, report.caught_up)
        return catch_up + (steps - (catch_up > 0)) * self.cost.c(name)  # a catch-up drafts one

    def _draft_steps(self, report: DraftReport) -> int:
        """Drafter steps a proposal took: one per token, and one more for the token a
        draft model drew and was too unsure of to offer (its stop)."""
        return max(1, len(report.draft) + self._stopped(report))


def auto_drafters(drafter: Drafter | None, lookup: Drafter) -> list[Drafter]:
    """The drafters auto mode consults, cheapest first: prompt lookup (always on
    offer: asking costs nothing), then the given draft model. A drafter that drafts
    from the text as lookup does (a copying drafter: the suffix drafter) takes
    lookup's place instead of being asked only where lookup found nothing."""
    if drafter is None:
        return [lookup]
    if drafter.kind == COPY:
        return [drafter]
    return [lookup, drafter]
