"""The example drafter of docs/drafters.md: where a line starts as the line before it
did, draft the rest of that line.

Lists, tables, logs and repeated calls often run line after line alike; this catches
those without an index of the whole text. It runs no model (q one-hot), so it needs
only a name, a kind and ``propose``; :class:`~edgespec.core.draft.DrafterBase`
supplies the rest of the protocol, and one line of ``registry.BUILTIN`` makes it
available to chat, serve and bench as ``-d lastline``.
"""

from __future__ import annotations

from typing import Sequence

from ..core.draft import COPY, Draft, DrafterBase

LONGEST_LINE = 256  # tokens: a "line" longer than this is no line to repeat


class RepeatLastLine(DrafterBase):
    """Draft the rest of the line before, if this line starts as that one did."""

    name = "lastline"
    kind = COPY

    def attach(self, target) -> None:
        """Learn which ids end a line, from the target's vocabulary."""
        self._ends_line = lambda token: b"\n" in target.token_bytes(token)

    def propose(self, context: Sequence[int], num_draft: int, params, rng, *,
                min_confidence: float | None = None) -> Draft:
        ends = []  # the last two line ends, at most LONGEST_LINE tokens back each
        i = len(context) - 1
        while len(ends) < 2 and i >= max(0, len(context) - 2 * LONGEST_LINE):
            if self._ends_line(context[i]):
                ends.append(i)
            i -= 1
        if len(ends) < 2:
            return Draft([])
        line, previous = context[ends[0] + 1:], context[ends[1] + 1:ends[0] + 1]
        if not line or len(line) >= len(previous) or list(previous[:len(line)]) != list(line):
            return Draft([])
        return Draft(list(previous[len(line):len(line) + num_draft]))

    def _ends_line(self, token: int) -> bool:  # (replaced by attach(): a target's vocabulary)
        return False
