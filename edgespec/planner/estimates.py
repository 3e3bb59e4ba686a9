"""What auto mode believes of its drafters: acceptance per draft position, offer rates,
and where a draft model's confidence stops paying.

Each rate is a prior plus exponentially weighted evidence (:class:`Rates`), so a few
rounds move it and old rounds fade; decisions may add a little optimism (a share of
a standard error) so that what may pay gets tried.
"""

from __future__ import annotations

import math
from typing import Sequence

from ..core.config import PlannerConfig


class Rates:
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
    repacked CPU kernels: v(4) < v(3)), and a stop set from it would stop a
    draft model that pays after its first rejected token. How often
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

    def __init__(self, config: PlannerConfig):
        self.config = config
        self.rates = [Rates((b + 0.5) / self.BINS, config.stop_prior_weight, config.decay)
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

    def __init__(self, config: PlannerConfig, prior: float, *, later_lift: float | None = None,
                 parent: "AcceptanceTracker | None" = None, offer_parent: Rates | None = None,
                 weight: float | None = None):
        self.config = config
        self.accept = Rates(prior, config.prior_weight if weight is None else weight,
                             config.decay, later_lift)
        self.offer = Rates(1.0, config.offer_weight, config.decay)
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
                        optimism: float = 0.0, hold: Sequence[float] | None = None) -> list[float]:
        """Committed tokens per plain step of a round of up to k drafts, for k = 1..k_max.

        The drafter runs while it offers tokens (c per step, the first always);
        the target verifies what was offered, v(1 + n) (a plain step when n = 0).
        ``overhead``: a catch-up the round pays first, in plain steps; ``optimism``
        as for :meth:`Rates.estimates`. ``hold``: the drafter's own chance, per draft
        position, that a token holds if the ones before did (a copy, from where copies
        broke in this text); it stands for the later positions, and caps the first,
        whose rate says whether such a copy starts at all.
        """
        accepts, offers = self._accept(k_max, optimism), self._offers(k_max, optimism)
        if hold:
            accepts = [min(accepts[0], hold[0]), *hold[1:k_max]]
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
