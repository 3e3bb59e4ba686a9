"""The ceiling: how much faster than plain decoding could any drafter make this
target, on this machine, on these prompts?

Speculation saves target passes, and a pass over n tokens costs v(n) plain
steps. Given the reply plain decoding gives (its token ids) and v(n) as
measured here, the cheapest way to commit that reply with drafts that are
always right is a shortest path (:func:`best_schedule`): at each position,
draft d tokens (one pass over d + 1 tokens commits d + 1) or step plainly.
Two ceilings come of it:

- any drafter: every token may be drafted (an oracle that knows the reply and
  costs nothing to ask); no drafter beats this, and a draft model, which pays
  c per drafted token, less still;
- any copying drafter (prompt lookup, the suffix drafter within a
  conversation): it can only draft tokens that continue an earlier occurrence
  of the token before them in the context, so a draft starting at position t
  is at most :func:`copy_lengths`'s run there.

Both are upper bounds: a real drafter also drafts tokens that are rejected,
and does not know where to stop. :class:`~edgespec.drafters.scheduled.ScheduledDrafter`
drafts a known reply on a schedule, so that the ceiling can be measured by the
engine itself (``scripts/ceiling.py``), not only computed.
"""

from __future__ import annotations

from typing import Callable, Sequence



def copy_lengths(context: Sequence[int], reply: Sequence[int], max_draft: int) -> list[int]:
    """For each position t of ``reply`` (after ``context``): the longest run
    ``reply[t:t + j]`` (j <= ``max_draft``) that follows some earlier occurrence
    of the token before it, in ``context`` and ``reply[:t]`` alone.

    A drafter that copies proposes what followed an earlier match of the
    context's end, so no draft it makes at t that is accepted is longer.
    """
    tokens = [int(x) for x in context]
    seen: dict[int, list[int]] = {}  # token -> the positions it occurs at, each with a successor
    for i in range(len(tokens) - 1):
        seen.setdefault(tokens[i], []).append(i)
    runs = []
    for t, token in enumerate(reply):
        best = 0
        for p in seen.get(tokens[-1], ()):
            j = 0
            while (j < max_draft and t + j < len(reply) and p + 1 + j < len(tokens)
                   and tokens[p + 1 + j] == reply[t + j]):
                j += 1
            best = max(best, j)
        runs.append(best)
        seen.setdefault(tokens[-1], []).append(len(tokens) - 1)  # it now has a successor
        tokens.append(int(token))
    return runs


def best_schedule(runs: Sequence[int], v: Callable[[int], float]) -> tuple[list[int], float]:
    """The cheapest way to commit a reply of ``len(runs)`` tokens when at
    position t a draft of up to ``runs[t]`` tokens is always accepted.

    Returns the draft length of each round, in order, and the total cost in
    plain steps (a round drafting d tokens costs ``v(d + 1)`` and commits
    d + 1 tokens; the last of them is the target's own).
    """
    n = len(runs)
    cost = [0.0] * (n + 1)
    choice = [0] * n
    for t in range(n - 1, -1, -1):
        options = range(min(runs[t], n - t - 1) + 1)
        choice[t] = min(options, key=lambda d: v(d + 1) + cost[t + d + 1])
        cost[t] = v(choice[t] + 1) + cost[t + choice[t] + 1]
    schedule, t = [], 0
    while t < n:
        schedule.append(choice[t])
        t += choice[t] + 1
    return schedule, cost[0]


def ceiling(runs: Sequence[int], v: Callable[[int], float]) -> float:
    """The highest speedup over plain decoding that drafts of ``runs`` allow."""
    return len(runs) / best_schedule(runs, v)[1] if runs else 1.0
