"""Auto mode: before each round, pick a drafter and k, or decode plainly.

Expected speed of a round, in tokens per plain target step (DESIGN.md):

    S(k) = E(k) / (k·c + v(k+1)),   E(k) = 1 + Σ_{j=1..k} Π_{i<=j} α_i

where c is the drafter's step cost and v(n) the target's n-token pass, both in
plain steps (:mod:`edgespec.costs` measures them in this run), and α_i the
probability that draft position i is accepted given the ones before it were.
Plain decoding has S = 1. A draft model that stops early when unsure also has
an offer rate per position (how often it drafts there at all); its prior is
how often the target itself was that sure of the tokens it committed. A draft
model that sat out some rounds must first catch up; that counts too.

α and the offer rates are tracked per drafter, and per kind of draft where a
drafter classes its drafts (prompt lookup by match length), as a prior plus
exponentially weighted evidence, so they follow the content. Decisions add a
little optimism (a fraction of a standard error), so a drafter that may pay
is tried until the evidence says otherwise; evidence ages while a drafter is
not tried, so a losing one is tried again now and then. And the costs the
decision rests on must be this run's own: while a drafter's cost or the
verify cost has not been measured lately, it is retried (with a back-off
that grows while retries lose), and a plain step is taken now and then to
keep the plain step's own cost fresh.

Every such try (a probe or a retry) is paid from an exploration budget: it
earns a fixed share of each committed token's time and is charged what each
try lost (refunded what one won): its passes at their typical cost, less the
tokens it committed, so that one pass on a busy moment does not spend it
all. So where speculation never pays
(chat with a draft model on a busy CPU), trying costs about that share and
no more, and where it pays, winning tries keep the budget full.

Choosing the proposal from past rounds only (never from the target's output
for the round being verified) keeps the acceptance rule exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from .costs import LONG_SIZES, CostModel, save_calibration
from .drafters.base import Drafter
from .planner import DraftReport, Proposal, RoundResult


@dataclass(frozen=True)
class PolicyConfig:
    """The tunables of auto mode (tuned on the built-in tuning prompt sets with
    ``scripts/policy_sim.py``, then measured with ``edgespec bench``)."""

    max_draft: int = 64           # the longest draft auto mode proposes
    draft_p_min: float = 0.7      # a draft model stops below this top probability ...
    learn_stop: bool = True       # ... at first: auto mode learns where drafting stops paying
    stop_prior_weight: float = 6.0  # pseudo-observations behind a confidence bin's α (its midpoint)
    lowest_stop: float = 0.05     # a draft model always stops below this
    decay: float = 0.95           # weight of the past in the acceptance estimates
    prior_weight: float = 3.0     # pseudo-observations behind a prior acceptance rate
    aging: float = 0.99           # evidence kept per round in which a drafter was not tried
    optimism: float = 0.35        # standard errors added to α when deciding (explores the unsure)
    min_gain: float = 1.04        # speculate when expected to beat plain by this much
    probe_gain: float = 1.04      # ... or, as a probe, when it might (with optimism)
    model_prior: float = 0.95     # α of a draft model before evidence
    model_prior_weight: float = 3.0  # ... and the pseudo-observations behind it
    offer_weight: float = 6.0     # pseudo-observations behind a draft model's offer rate
    confidence_prior: float = 0.4  # the target's confidence before any token
    confidence_weight: float = 2.0
    confidence_decay: float = 0.95  # the target's confidence changes with the text: follow it
    # α before evidence, by drafter and kind of draft. A copy (prompt lookup, and the
    # suffix drafter where the context holds the longest match) is classed by how far
    # back its match reaches: 2 tokens is often a coincidence, 16 or more a copy in
    # progress. The suffix drafter's other drafts are classed by their empirical
    # probability and first match (edgespec.drafters.suffix.confidence_bucket).
    priors: dict[str, float] = field(default_factory=lambda: {
        **{f"{name}:{bucket}": alpha for name in ("lookup", "suffix") for bucket, alpha in (
            ("match2", 0.3), ("match3", 0.4), ("match4", 0.6), ("match8", 0.8),
            ("match16", 0.85), ("match32", 0.9))},
        "lookup": 0.5,
        "suffix": 0.5, "suffix:maybe": 0.3, "suffix:maybe-long": 0.4, "suffix:likely": 0.4,
        "suffix:likely-long": 0.5, "suffix:sure": 0.6, "suffix:sure-long": 0.8})
    # A draft that continues a copy is accepted whole or cut at one point: the α of the
    # later positions, given the ones before were accepted (one rate, shared), starts
    # from the first position's α lifted by this share of its distance to 1.
    continuation_lift: float = 0.3
    compare_drafters: bool = True  # a cheap drafter's draft gives way to a better later one
    catch_up_rounds: float = 3.0  # rounds a draft model's catch-up is spread over (it pays
    #                               once for a run of rounds, but not to get back in for one)
    cheap_drafter: float = 0.05   # a drafter cheaper than this (c) is asked for all it has
    retry_after: int = 32         # rounds before a drafter whose costs are unmeasured is retried
    retry_max: int = 512          # the longest back-off between losing retries
    retry_budget: float = 1.0     # plain steps a retry's catch-up may cost
    stale_after: int = 256        # rounds after which a measured cost counts as unmeasured
    refresh_plain_after: int = 128  # rounds between plain steps that re-measure the plain step
    # Exploration is paid from a budget, in plain steps: it starts at explore_start, earns
    # explore_rate per committed token, is charged what each probe round lost at typical costs
    # (credited what one won) and holds at most explore_cap. Where nothing pays, probes cost
    # ~explore_rate.
    explore_start: float = 2.0
    explore_rate: float = 0.01
    explore_cap: float = 4.0


class _Rates:
    """Per-position success rates: a prior plus exponentially weighted evidence.

    rate_i = (hits_i + w·prior_i) / (trials_i + w), so a few rounds move it
    away from the prior and old rounds fade (``decay`` per observation). The
    prior of position 0 is ``prior``; of a later position, the estimate of the
    position before it, or with a ``later_lift``, position 0's estimate lifted
    by that share of its distance to 1.
    """

    def __init__(self, prior: float, weight: float, decay: float, later_lift: float | None = None):
        self.prior, self.weight, self.decay, self.later_lift = prior, weight, decay, later_lift
        self.hits: list[float] = []
        self.trials: list[float] = []

    def observe(self, position: int, hit: bool) -> None:
        while position >= len(self.trials):
            self.hits.append(0.0)
            self.trials.append(0.0)
        self.hits[position] = self.decay * self.hits[position] + (1.0 if hit else 0.0)
        self.trials[position] = self.decay * self.trials[position] + 1.0

    def age(self, factor: float) -> None:
        self.hits = [h * factor for h in self.hits]
        self.trials = [t * factor for t in self.trials]

    def estimates(self, k: int, optimism: float = 0.0, prior: float | None = None) -> list[float]:
        """Rates of positions 0..k-1, plus ``optimism`` standard errors (capped at 1).

        ``prior`` replaces the prior of position 0. With a ``later_lift``, the
        positions after the first share one rate, from the evidence of all of them
        (a copy goes on, or ends, at about the same rate at every position, so the
        positions tested teach the ones not tested yet). Its prior follows position
        0's: a copy that often fails to start here is a weak copy, and goes on less.
        """
        result, prior = [], self.prior if prior is None else prior
        for i in range(k):
            if i == 1 and self.later_lift is not None:  # one shared rate from here on
                shared = self._estimate(sum(self.hits[1:]), sum(self.trials[1:]),
                                        prior + (1.0 - prior) * self.later_lift, optimism)[1]
                return result + [shared] * (k - 1)
            trials = self.trials[i] if i < len(self.trials) else 0.0
            hits = self.hits[i] if i < len(self.hits) else 0.0
            prior, estimate = self._estimate(hits, trials, prior, optimism)
            result.append(estimate)
        return result

    def _estimate(self, hits: float, trials: float, prior: float, optimism: float) -> tuple[float, float]:
        """The rate from this evidence and prior, and it plus ``optimism`` standard errors."""
        n = trials + self.weight
        mean = (hits + self.weight * prior) / n
        return mean, min(1.0, mean + optimism * math.sqrt(mean * (1 - mean) / n))


def _logit(p: float) -> float:
    p = min(max(p, 0.001), 0.999)
    return math.log(p / (1.0 - p))


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


class StopRule:
    """Where a draft model stops drafting: the lowest top probability (of its own,
    before it samples a token) at which one more draft token still pays.

    Drafting one more token costs a drafter step and a wider target pass, and
    yields a token only if accepted. The pass widens by the average step of v
    over the longest draft, c + (v(k+1) - v(1)) / k plain steps: v(2) - v(1)
    alone overstates it where wider passes cost little more (llama.cpp's
    repacked CPU kernels: v(4) < v(3)), and a stop set from it gave up after
    one rejected token on prompts where a draft model wins. How often
    the target accepts a draft depends on how sure the drafter was, and how
    well a drafter's confidence predicts that differs by model pair and
    temperature, so the acceptance is learned per confidence bin (tenths),
    each starting halfway between its midpoint (a calibrated drafter's) and
    the drafter's acceptance at its first draft position (a drafter whose confidence
    says little: a noisy one is accepted far more often than it is sure). The stop is the
    lower edge of the lowest bin, counting down from the top, whose α clears
    that cost, with a little optimism so the bin below is tried now and then;
    each bin's prior weighs as several rounds, so one rejection does not move
    the stop a whole bin. On a CPU (token cost ~ 0.75) this stops near where
    llama.cpp's --draft-p-min does; on a GPU (~0.35) it drafts on through less
    certain tokens, as it should.
    """

    BINS = 10

    def __init__(self, config: PolicyConfig):
        self.config = config
        self.rates = [_Rates((b + 0.5) / self.BINS, config.stop_prior_weight, config.decay)
                      for b in range(self.BINS)]

    def observe(self, confidence: Sequence[float], accepted: int) -> None:
        """A verified draft: its tokens' confidences, the first ``accepted`` accepted."""
        for i, sure in enumerate(confidence[:accepted + 1]):  # after a rejection: untested
            self.rates[min(int(sure * self.BINS), self.BINS - 1)].observe(0, i < accepted)

    def threshold(self, token_cost: float, acceptance: float) -> float:
        """The stop for a marginal draft token that costs ``token_cost`` plain steps,
        for a drafter whose first drafts are accepted at rate ``acceptance``."""
        if not self.config.learn_stop:
            return self.config.draft_p_min
        stop = (self.BINS - 1) / self.BINS  # even the top bin: drafting only when nearly sure
        for b in reversed(range(self.BINS)):
            prior = ((b + 0.5) / self.BINS + acceptance) / 2
            if self.rates[b].estimates(1, self.config.optimism, prior)[0] < token_cost:
                break
            stop = b / self.BINS
        return max(stop, self.config.lowest_stop)


class AcceptanceTracker:
    """What a drafter's rounds yield, per draft position.

    Two rates per position i: whether the drafter offers a token there at all
    (a draft model stops early when its own top probability is low), and
    whether the target accepts it, given the drafts before it were accepted.
    """

    def __init__(self, config: PolicyConfig, prior: float, *, later_lift: float | None = None,
                 parent: "AcceptanceTracker | None" = None, offer_parent: _Rates | None = None,
                 weight: float | None = None):
        self.config = config
        self.accept = _Rates(prior, config.prior_weight if weight is None else weight,
                             config.decay, later_lift)
        self.offer = _Rates(1.0, config.offer_weight, config.decay)
        # A tracker pooled over the kinds of one drafter's drafts: where it does better than
        # its prior, this one's prior rises alike (in log-odds), so that when lookup copies
        # well here, short matches are tried too; a long match's prior is not averaged away.
        self.parent = parent
        # A rate whose estimate is the prior of the offer rate (the target's confidence).
        self.offer_parent = offer_parent

    def _accept(self, k: int, optimism: float) -> list[float]:
        prior = None
        if self.parent is not None:  # shifted (in log-odds) as far as the pool strays from its prior
            parent = self.parent.accept
            prior = _sigmoid(_logit(self.accept.prior) + _logit(parent.estimates(1)[0])
                             - _logit(parent.prior))
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

    def age(self) -> None:
        """Trust the evidence a little less (the drafter was not tried this round)."""
        self.accept.age(self.config.aging)
        self.offer.age(self.config.aging)

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
        ``overhead``: a catch-up the round pays first, in plain steps; ``optimism``
        as for :meth:`_Rates.estimates`.
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


@dataclass
class _DrafterState:
    """What the planner remembers of one drafter across rounds."""

    behind: int = 0            # committed tokens since it last caught up
    since_retry: float = math.inf  # rounds since it was last retried
    retry_after: int = 0       # back-off between retries while its costs are unmeasured
    retrying: bool = False     # the round in flight is such a retry


class AdaptivePlanner:
    """Auto mode over a list of drafters (asked in order; the first whose draft
    pays wins the round), choosing k to maximise E / (k·c + v(k+1)).

    Keeps its estimates across generations: an engine (and so a chat) learns
    what its drafters are worth on this conversation once, not every turn.
    """

    def __init__(self, drafters: Sequence[Drafter], cost: CostModel | None = None,
                 config: PolicyConfig | None = None, *, save_costs_to: Path | None = None):
        self.drafters = list(drafters)
        self.cost = cost or CostModel()
        self.save_costs_to = save_costs_to  # where close() keeps this run's costs
        self.config = config or PolicyConfig()
        self.max_draft = self.config.max_draft
        # The target's confidence is a draft model's offer prior: over a 150k vocabulary
        # it costs a pass per committed token, so it is asked for only with one on offer.
        self.wants_confidence = any(self._is_draft_model(d.name) for d in self.drafters)
        self.trackers: dict[str, AcceptanceTracker] = {}
        # How often the target is itself confident (top probability at least the draft
        # model's threshold) about the tokens it commits: known for every token it
        # commits, and close to how often the draft model offers a token at all, so it
        # is that rate's prior (a draft model is not asked over and over in hard text).
        self.confidence = _Rates(self.config.confidence_prior, self.config.confidence_weight,
                                 self.config.confidence_decay)
        self.stop = StopRule(self.config)
        self.stop_at = self.config.draft_p_min  # where draft models stop (set before each ask)
        self._confidence: list[float] | None = None  # of the draft model's draft in flight
        self._lent_stop: tuple[Drafter, float] | None = None  # a draft model's own stop, to give back
        self._state = {d.name: _DrafterState(retry_after=self.config.retry_after)
                       for d in self.drafters}
        self._asked: set[str] = set()  # drafters asked this round
        self._caught_up: set[str] = set()  # ... and of those, the ones that drafted
        self._verifying: tuple[str, bool] | None = None  # drafter, whether its draft stopped
        self._draft_cost = 0.0  # what the drafting in the round in flight typically costs, in plain steps
        self._limit = 0  # the longest draft this round may verify
        self.exploration = self.config.explore_start  # plain steps that tries may still lose
        self._exploring = False  # the round in flight asked or verified a probe or a retry

    @property
    def name(self) -> str:
        return "auto(" + "+".join(d.name for d in self.drafters) + ")"

    def tracker(self, key: str) -> AcceptanceTracker:
        """The acceptance tracker of a drafter (``name``) or of one kind of its drafts
        (``name:bucket``)."""
        if key not in self.trackers:
            cfg = self.config
            name, _, bucket = key.partition(":")
            if bucket:
                self.trackers[key] = AcceptanceTracker(
                    cfg, cfg.priors.get(key, cfg.priors.get(name, cfg.model_prior)),
                    later_lift=cfg.continuation_lift, parent=self.tracker(name))
            elif self._is_draft_model(name):
                self.trackers[key] = AcceptanceTracker(cfg, cfg.model_prior, offer_parent=self.confidence,
                                                       weight=cfg.model_prior_weight)
            else:  # a drafter that classes its drafts (prompt lookup)
                self.trackers[key] = AcceptanceTracker(cfg, cfg.priors[name])
        return self.trackers[key]

    def _is_draft_model(self, name: str) -> bool:
        """Drafters with priors of their own (prompt lookup, suffix) class their drafts;
        the rest are draft models (an offer rate, a confidence stop)."""
        return name not in self.config.priors

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
            if self.cost.c(drafter.name) < self.config.cheap_drafter:
                return Proposal(drafter, limit)  # asking costs nothing: decide on the draft
            if self._is_draft_model(drafter.name):  # where it stops, for this ask only
                token_cost = self.cost.c(drafter.name) + (self.cost.v(limit + 1) - self.cost.v(1)) / limit
                alpha = self.tracker(drafter.name).alpha
                self._give_back_stop()  # a second draft model asked this round: the first's first
                self._lent_stop = (drafter, getattr(drafter, "min_confidence", 0.0))
                drafter.min_confidence = self.stop_at = self.stop.threshold(
                    token_cost, alpha[0] if alpha else self.config.model_prior)
            k, probe = self._decide(drafter.name, drafter.name, limit)
            if k:
                self._exploring |= probe  # its drafting is paid from the budget too
                return Proposal(drafter, k, probe)
        return None

    def review(self, report: DraftReport) -> Proposal | None:
        self._give_back_stop()
        proposal, draft = report.proposal, report.draft
        name = proposal.drafter.name
        self._observe_draft_cost(name, report)
        self._draft_cost += self._typical_draft_cost(name, report)
        self._caught_up.add(name)
        stopped = draft.bucket is None and len(draft) < proposal.num_draft
        if not draft.token_ids:
            if stopped:  # a draft model unsure of even its first token
                self.tracker(name).update(0, 0, stopped=True)
            return None
        verified = Proposal(proposal.drafter, len(draft), proposal.probe)
        if draft.bucket is not None:  # decide now that the kind of draft is known
            keep, probe = self._decide(f"{name}:{draft.bucket}", name, len(draft))
            if not keep or (self.config.compare_drafters and self._better_later(
                    self.best_k(f"{name}:{draft.bucket}", name, keep)[1])):
                return None
            verified = Proposal(proposal.drafter, keep, probe)
        self._exploring |= verified.probe
        self._verifying = (name, stopped and verified.num_draft == len(draft))
        self._confidence = draft.confidence
        return verified

    def observe(self, result: RoundResult) -> None:
        cfg = self.config
        self.cost.observe_target(result.target_tokens, result.target_seconds)
        self.confidence_update(result.target_top_probs)
        verified = self._verifying[0] if self._verifying and result.drafter else None
        if verified is not None:
            name, stopped = self._verifying
            self.tracker(name).update(result.num_drafted, result.num_accepted, stopped)
            if result.bucket is not None:
                self.tracker(f"{name}:{result.bucket}").update(result.num_drafted, result.num_accepted)
            if self._confidence is not None:
                self.stop.observe(self._confidence[:result.num_drafted], result.num_accepted)
        self._pay_exploration(result)
        for drafter in self.drafters:
            state = self._state[drafter.name]
            if drafter.name == verified:  # it holds its accepted drafts: 1 or 2 tokens to go
                state.behind = 1 + (result.num_accepted == result.num_drafted)
            else:
                state.behind = (0 if drafter.name in self._caught_up else state.behind) \
                    + result.num_committed
            state.since_retry += 1
            if state.retrying:  # back off further while retries lose (on typical costs, too)
                won = drafter.name == verified and \
                    result.num_committed > self.cost.v(result.target_tokens) + self._draft_cost
                state.retry_after = cfg.retry_after if won else min(2 * state.retry_after, cfg.retry_max)
        self._end_round()

    def _end_round(self) -> None:
        """Forget the round in flight (also one that a cancel or an error cut short
        between review and observe: the next generation must not pay for it)."""
        self._give_back_stop()
        self._asked.clear()
        self._caught_up.clear()
        self._verifying, self._confidence = None, None
        self._draft_cost = 0.0
        self._exploring = False
        for state in self._state.values():
            state.retrying = False

    def _give_back_stop(self) -> None:
        """Leave a draft model its own stop (none, or the user's --draft-p-min) once
        it drafted: a fixed k set later (chat's /set num_draft) must not inherit the
        stop auto mode learned."""
        if self._lent_stop is not None:
            drafter, stop = self._lent_stop
            drafter.min_confidence = stop
            self._lent_stop = None

    def _pay_exploration(self, result: RoundResult) -> None:
        """Earn this round's share of the budget; charge it what a try lost (in plain
        steps: what its passes typically cost, less the tokens it committed).

        Typical costs (the cost model's medians, which this round's timings join),
        not this round's clock: one pass on a busy moment had cost a reply its whole
        budget, so that a draft model paying its way on the code set was never tried
        again in it (scripts/auto_trace.py, session 16)."""
        cfg = self.config
        self.exploration += cfg.explore_rate * result.num_committed
        if self._exploring:  # plan() proposes nothing before plain steps were timed
            spent = self.cost.v(result.target_tokens) + self._draft_cost
            self.exploration -= spent - result.num_committed
        self.exploration = min(self.exploration, cfg.explore_cap)

    def timing_wanted(self) -> Sequence[int]:
        """The long pass sizes (16, 32, 64 tokens, as far as the longest draft needs) that
        neither this run nor its prior has timed: the calibration times only short ones,
        and what a longer pass costs cannot be told from them (on one CPU v(16) ~ v(9),
        on another ~ 2 v(9)). What a run times is kept for the next (:meth:`close`)."""
        known = set(self.cost.measured_sizes()) | set(self.cost.prior_v)
        return tuple(n for n in sorted(LONG_SIZES, reverse=True) if n <= self.max_draft + 1 and n not in known)

    def observe_pass(self, num_tokens: int, seconds: float) -> None:
        self.cost.observe_target(num_tokens, seconds)

    def close(self) -> None:
        """Keep this run's measured costs as the next run's prior (only if it measured)."""
        if self.save_costs_to is not None and self.cost.step_seconds is not None:
            save_calibration(self.cost.as_prior(), self.save_costs_to)

    def confidence_update(self, top_probs: np.ndarray) -> None:
        """Learn whether the target was confident about each token it committed."""
        for top in np.asarray(top_probs).reshape(-1):
            self.confidence.observe(0, bool(top >= self.stop_at))

    # -- decisions --------------------------------------------------------------------------

    def best_k(self, key: str, cost_name: str, limit: int, *, behind: int = 0,
               optimism: float = 0.0) -> tuple[int, float]:
        """The k (1..limit) with the highest expected speed, and that speed."""
        tracker, c = self.tracker(key), self.cost.c(cost_name)
        # A draft model that sat out rounds first catches up on them (batched).
        # It pays that once to draft for the rounds after it too: spread it over them.
        overhead = self._catch_up(cost_name, behind) / self.config.catch_up_rounds
        k_max = min(limit, self.max_draft)
        if k_max < 1:
            return 0, 1.0
        v = [0.0] + [self.cost.v(n) for n in range(1, k_max + 2)]
        speeds = tracker.expected_speeds(k_max, c, v.__getitem__, overhead, optimism)
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

    def _decide(self, key: str, name: str, limit: int) -> tuple[int, bool]:
        """How far drafter ``name`` should draft (tracked under ``key``), and whether
        that is a probe; (0, False) for not at all."""
        cfg, state = self.config, self._state[name]
        k, speed = self.best_k(key, name, limit, behind=state.behind)
        if speed >= cfg.min_gain:
            return k, False
        if self.exploration > 0:  # tries are paid from the exploration budget
            # Hope is for the drafter in step with the text. A draft model that sat out
            # owes a catch-up that grows with every token it misses: priced into the hope,
            # it locked the model out for the rest of a reply while its speed in step rose
            # past 1.04 (scripts/auto_trace.py on the code set). The catch-up is what the
            # probe risks instead (_affordable), so the budget bounds it.
            k, hope = self.best_k(key, name, limit, optimism=cfg.optimism)
            probe = self._affordable(name, k, state.behind) if hope >= cfg.probe_gain else 0
            if probe:
                return probe, True
            # The decision rests on costs this run has not measured (lately): retry now and
            # then, so that a wrong cached number is corrected instead of locking this off,
            # but only while a catch-up is cheap (a draft model that sat out long is not).
            if self.cost.rounds_since_measured(name) > cfg.stale_after \
                    and state.since_retry >= state.retry_after \
                    and self._catch_up(name, state.behind) <= cfg.retry_budget:
                state.retrying, state.since_retry = True, 0
                return k, True
        self.tracker(key).age()
        return 0, False

    def _affordable(self, name: str, k: int, behind: int) -> int:
        """The longest probe, up to ``k`` drafts, whose loss if every draft were
        rejected (a catch-up included) the exploration budget still covers; 0 if
        none: one probe that failed would leave nothing to try with for hundreds
        of tokens."""
        cost, overhead = self.cost, self._catch_up(name, behind)
        while k > 0 and overhead + k * cost.c(name) + cost.v(k + 1) - 1 > self.exploration:
            k -= 1
        return k

    def _catch_up(self, name: str, behind: int) -> float:
        """What a drafter ``behind`` committed tokens behind pays, in plain steps, before
        it drafts: nothing for the one or two tokens after a round it drafted in (its
        first drafting step takes them), a batched catch-up after sitting out."""
        return self.cost.catch_up(name, behind) if behind > 2 else 0.0

    def _observe_draft_cost(self, name: str, report: DraftReport) -> None:
        """Drafter step and catch-up costs from a timed proposal."""
        steps = self._draft_steps(report)
        if report.caught_up > 2:  # a catch-up after sitting out: not a drafting step
            if steps > 1:
                self.cost.observe_draft(name, steps - 1, report.draft_seconds)
        else:  # the usual one or two tokens: the first drafting step
            self.cost.observe_draft(name, steps, report.catch_up_seconds + report.draft_seconds)

    def _typical_draft_cost(self, name: str, report: DraftReport) -> float:
        """What a proposal like ``report``'s typically costs, in plain steps: its
        drafting steps and, after sitting out, its catch-up."""
        steps, catch_up = self._draft_steps(report), self._catch_up(name, report.caught_up)
        return catch_up + (steps - (catch_up > 0)) * self.cost.c(name)  # a catch-up drafts one

    @staticmethod
    def _draft_steps(report: DraftReport) -> int:
        """Drafter steps a proposal took: one per token, and one more for the token a
        draft model drew and was too unsure of to offer (its stop)."""
        draft = report.draft
        return max(1, len(draft) + (len(draft) < report.proposal.num_draft and draft.bucket is None))


def auto_drafters(drafter: Drafter | None, lookup: Drafter,
                  config: PolicyConfig | None = None) -> list[Drafter]:
    """The drafters auto mode consults, cheapest first: prompt lookup (always on
    offer: asking costs nothing), then the given draft model. A drafter that drafts
    from the text as lookup does (one with priors of its own: lookup, suffix) takes
    lookup's place instead of being asked only where lookup found nothing."""
    if drafter is None:
        return [lookup]
    if drafter.name in (config or PolicyConfig()).priors:
        return [drafter]
    return [lookup, drafter]
