"""The planner interface: the engine asks, a planner decides, a drafter proposes.

Each round the engine calls :func:`draft_round`: it asks the planner for a
:class:`Proposal` (a drafter, how many tokens it may draft, and for a draft model
where it stops), times the drafter's catch-up and proposal, hands the planner that
:class:`DraftReport` and learns how much of the draft to verify (nothing: ask the planner again; it may
offer the next drafter on its list, or nothing, which makes the round a plain
step). After the target's pass the planner hears the :class:`RoundResult`: the
round's reports, what was verified and what came of it. A planner decides on
these plain facts alone, and sets nothing on a drafter.

:class:`FixedPlanner` is the fixed-k planner; the adaptive one (auto mode) is
:class:`edgespec.planner.AdaptivePlanner`. The engine is handed its planners ready
made, by a :class:`Planners` (one planner per drafter and k): :class:`FixedPlanners`
here, which makes fixed-k ones only, or auto mode's
(:class:`edgespec.planner.AutoPlanners`, which ``edgespec.load`` and the server use).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import numpy as np

from ..errors import EdgespecError
from .draft import NO_DRAFTER, Draft, Drafter


@dataclass(frozen=True)
class Proposal:
    """Ask ``drafter`` for up to ``num_draft`` tokens. ``probe``: the planner
    expects this to lose on what it knows so far, but tries it to learn more;
    ``retry``: to measure costs it has not measured lately. ``min_confidence``:
    where a draft model stops for this proposal (None: its own setting)."""

    drafter: Drafter
    num_draft: int
    probe: bool = False
    min_confidence: float | None = None
    retry: bool = False


@dataclass(frozen=True)
class DraftReport:
    """What came of a proposal: the draft, and what producing it took."""

    proposal: Proposal
    draft: Draft
    caught_up: int            # committed tokens the drafter evaluated first (its prefill)
    catch_up_seconds: float
    draft_seconds: float      # the proposal itself


@dataclass(frozen=True)
class RoundResult:
    """One round: what was drafted, the target pass, and what it committed.

    ``reports``: every draft made this round, in order (a drafter whose draft was
    not worth verifying, then the next); ``verified``: what of the last one was
    verified (None: a plain step). ``drafter`` and ``bucket`` name it; ``num_drafted``
    tokens were verified (fewer than ``verified.num_draft`` where the target lacks
    an id). ``target_seconds`` covers the pass over ``target_tokens`` tokens and
    the verification of its rows. ``target_top_probs`` holds the target's top
    probability at each committed token (at temperature 0, of its softmax), a
    fact about the text that needs no drafter to learn; empty unless the planner
    ``wants_confidence`` (over a 150k vocabulary it costs a pass per row, a third
    of the host's work per greedy token).
    """

    drafter: str | None
    bucket: str | None
    num_drafted: int
    num_accepted: int
    target_tokens: int
    target_seconds: float
    target_top_probs: np.ndarray
    reports: tuple[DraftReport, ...] = ()
    verified: Proposal | None = None

    @property
    def num_committed(self) -> int:
        return self.num_accepted + 1


class Planner(Protocol):
    """Decides, round by round, which drafter drafts and how far."""

    max_draft: int  # the longest draft it ever asks for
    wants_confidence: bool  # whether it reads RoundResult.target_top_probs (a pass per row)
    drafters: list[Drafter]  # every drafter it may ask (the engine prefills and rewinds them)
    name: str  # how stats name the drafting: a drafter's name, "auto(...)" or "none"

    def begin(self, context: Sequence[int]) -> None:
        """A generation starts after ``context``; every drafter has been prefilled."""

    def plan(self, context: Sequence[int], limit: int) -> Proposal | None:
        """The next proposal to try this round (at most ``limit`` tokens), or None."""

    def review(self, report: DraftReport) -> Proposal | None:
        """What of the reported draft to verify: its first ``num_draft`` tokens
        (``probe`` as in :class:`Proposal`), or None for none of it."""

    def observe(self, result: RoundResult) -> None:
        """Learn from a finished round; the next :meth:`plan` starts a new round."""

    def close(self) -> None:
        """The engine is closing: keep what is worth keeping (an auto planner: its costs)."""


class FixedPlanner:
    """Always the same drafter and k (or plain decoding without a drafter); a draft
    shorter than ``min_draft`` is not verified (llama.cpp's --draft-min)."""

    def __init__(self, drafter: Drafter | None, num_draft: int, min_draft: int = 0):
        if not (isinstance(num_draft, int) and num_draft >= 1):
            raise ValueError(f"invalid num_draft={num_draft!r}: must be an integer >= 1 or 'auto'")
        self.drafter = drafter
        self.max_draft = num_draft
        self.min_draft = min_draft
        self.wants_confidence = False
        self._asked = False

    @property
    def drafters(self) -> list[Drafter]:
        return [self.drafter] if self.drafter is not None else []

    @property
    def name(self) -> str:
        return self.drafter.name if self.drafter is not None else NO_DRAFTER

    def begin(self, context: Sequence[int]) -> None:
        self._asked = False

    def plan(self, context: Sequence[int], limit: int) -> Proposal | None:
        if self._asked or self.drafter is None:
            return None
        self._asked = True
        return Proposal(self.drafter, min(limit, self.max_draft))

    def review(self, report: DraftReport) -> Proposal | None:
        n = len(report.draft)
        return Proposal(self.drafter, n) if n and n >= self.min_draft else None

    def observe(self, result: RoundResult) -> None:
        self._asked = False

    def close(self) -> None:
        pass


class Planners(Protocol):
    """Where an engine gets the planner for a drafter and k: ready made, kept per
    drafter as the source sees fit. ``target`` is the cache the engine generates
    through (a source that times passes times them there, between generations) and
    ``clock`` the engine's."""

    defer: bool  # time a new planner's costs later (time_pending), not where it is made

    def planner(self, drafter: Drafter | None, num_draft: int | str, *, target, clock) -> Planner:
        """The planner for ``drafter`` and ``num_draft`` (k, or ``"auto"``)."""

    @property
    def pending(self) -> bool:
        """Whether a planner made with ``defer`` waits to be timed."""

    def time_pending(self, target, clock) -> None:
        """Time what the planners made with ``defer`` wait for, through ``target``."""

    def close(self) -> None:
        """The engine is closing: close every planner made (auto mode keeps its costs)."""


AUTO = "auto"  # num_draft for auto mode


def check_num_draft(num_draft: int | str) -> None:
    """Refuse a k that is neither an integer >= 1 nor ``"auto"``."""
    if num_draft != AUTO and not (isinstance(num_draft, int) and not isinstance(num_draft, bool)
                                  and num_draft >= 1):
        raise ValueError(f"invalid num_draft={num_draft!r}: must be an integer >= 1 or 'auto'")


class FixedPlanners:
    """Fixed-k planners only: what an engine made without auto mode's source uses."""

    def planner(self, drafter: Drafter | None, num_draft: int | str, *, target=None,
                clock=None) -> Planner:
        if num_draft == AUTO:
            raise EdgespecError("auto mode needs its planners: load with edgespec.load, or give "
                                "the Engine planners=edgespec.planner.AutoPlanners()")
        return FixedPlanner(drafter, num_draft)

    defer, pending = False, False  # (a fixed k times nothing)

    def time_pending(self, target=None, clock=None) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class DraftingRound:
    """What drafting one round came to: every report made (in order), what of the
    last one to verify (None: nothing, a plain step), that draft, and the seconds
    the drafters took."""

    reports: tuple[DraftReport, ...]
    verified: Proposal | None
    draft: Draft
    seconds: float


def draft_round(planner: Planner, context: Sequence[int], limit: int, params, rng,
                clock: Callable[[], float], shaping=None) -> DraftingRound:
    """Ask ``planner``'s drafters, in the planner's order, for a draft worth verifying
    (at most ``limit`` tokens): each drafter catches up with ``context`` and proposes,
    timed by ``clock``, until the planner takes a draft or has nothing more to try.
    ``shaping``: the request's (:class:`~edgespec.core.shaping.Shaping`), for a drafter
    whose q follows it."""
    reports: list[DraftReport] = []
    seconds = 0.0
    while (proposal := planner.plan(context, limit)) is not None:
        drafter = proposal.drafter
        start = clock()
        caught_up = drafter.prefill(context)
        proposed = clock()
        # A drafter whose q can follow a request's shaping gets it (drafts a grammar
        # refuses would be wasted); the others' refused drafts are cut before verifying.
        extra = {"shaping": shaping} if shaping is not None and drafter.shapes_q else {}
        draft = drafter.propose(context, proposal.num_draft, params, rng,
                                min_confidence=proposal.min_confidence, **extra)
        done = clock()
        seconds += done - start
        reports.append(DraftReport(proposal, draft, caught_up, proposed - start, done - proposed))
        verified = planner.review(reports[-1])
        if verified is not None:
            return DraftingRound(tuple(reports), verified, draft.truncated(verified.num_draft), seconds)
    return DraftingRound(tuple(reports), None, Draft([]), seconds)
