"""A drafter of a known reply, on a schedule: how the ceiling is measured in the engine.

``scripts/ceiling.py`` gives it plain decoding's reply and the cheapest schedule of
always-right drafts (:func:`edgespec.measure.ceiling.best_schedule`), so the engine itself
shows what the computed ceiling says.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..core.sampling import SamplingParams
from ..core.draft import COPY, Draft, DrafterBase


class ScheduledDrafter(DrafterBase):
    """Drafts a known reply on a schedule (:func:`edgespec.measure.ceiling.best_schedule`).

    Deterministic (q one-hot), so it is verified like prompt lookup. Where the
    generation parts from ``reply`` (at temperature 0 only a near-tie that a
    batched pass rounds the other way can do that) it drafts nothing more.
    """

    name = "oracle"
    kind = COPY

    def __init__(self, reply: Sequence[int], schedule: Sequence[int]):
        self.reply = [int(x) for x in reply]
        self._drafts: dict[int, int] = {}  # position in the reply -> draft length
        t = 0
        for d in schedule:
            self._drafts[t] = d
            t += d + 1
        self._start: int | None = None

    def prefill(self, context: Sequence[int]) -> int:
        if self._start is None:
            self._start = len(context)  # the prompt: the reply starts here
        return 0

    def propose(self, context: Sequence[int], num_draft: int, params: SamplingParams,
                rng: np.random.Generator, *, min_confidence: float | None = None) -> Draft:
        t = len(context) - self._start
        if list(context[self._start:]) != self.reply[:t]:
            return Draft([])
        return Draft(self.reply[t:t + min(num_draft, self._drafts.get(t, 0))])

    def reset(self) -> None:
        self._start = None
