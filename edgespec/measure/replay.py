"""A run's decisions, and its clock replayed: auto mode decides from the text and from
what the clock reads, so a run replayed with the same starting costs and the same
readings of the clock makes the same decisions, round by round (and, since the passes
are the same, writes the same text). ``scripts/decisions.py`` records fresh runs of a
request, says where they part, and replays one to show it is the clock that moved.
"""

from __future__ import annotations

import time
from typing import Callable


class RecordingClock:
    """A clock (``clock``'s readings) that keeps every reading, to be replayed."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock, self.readings = clock, []

    def __call__(self) -> float:
        now = self.clock()
        self.readings.append(now)
        return now


class ReplayingClock:
    """A clock that reads as a recorded run's did, reading for reading."""

    def __init__(self, readings):
        self.readings, self.read = list(readings), 0

    def __call__(self) -> float:
        if self.read >= len(self.readings):
            raise RuntimeError(f"the replay read the clock more often than the run it replays "
                               f"({len(self.readings)} readings): it decided otherwise before")
        self.read += 1
        return self.readings[self.read - 1]


def decision(result) -> dict:
    """What a round (a :class:`~edgespec.core.planner.RoundResult`) decided and what came
    of it: the drafter verified (None: a plain step), the draft's kind, tokens verified
    and accepted, the pass size, and every draft offered (drafter, length asked, length
    drafted)."""
    return {"drafter": result.drafter, "bucket": result.bucket, "drafted": result.num_drafted,
            "accepted": result.num_accepted, "pass": result.target_tokens,
            "offered": [[r.proposal.drafter.name, r.proposal.num_draft, len(r.draft)]
                        for r in result.reports]}


def record_decisions(planner, then: Callable | None = None) -> list[dict]:
    """Every round ``planner`` observes from now on, as :func:`decision` (and whatever
    ``then(result)`` adds to it), in a list that grows as it runs."""
    rounds, observe = [], planner.observe

    def recorded(result) -> None:
        observe(result)
        rounds.append({**decision(result), **(then(result) if then else {})})

    planner.observe = recorded
    return rounds
