"""The exploration budget: what tries made on hope rather than evidence may lose.

A probe (a drafter tried where the estimates say it might pay) or a retry (a
drafter whose costs this run has not measured lately) is paid from the budget:
it earns a fixed share of each committed token's time, and a round that tried
is charged what it lost (credited what it won), in plain steps. So where
nothing pays, trying costs about that share; where it pays, winning tries keep
the budget full.
"""

from __future__ import annotations

from ..core.config import PlannerConfig


class ExplorationBudget:
    """The balance, in plain steps (:class:`PlannerConfig`'s ``explore_*`` settings)."""

    def __init__(self, config: PlannerConfig):
        self.config = config
        self.balance = config.explore_start

    def settle(self, committed: int, spent: float | None) -> None:
        """A round committed ``committed`` tokens; if it tried something, its passes
        typically cost ``spent`` plain steps (None: it tried nothing)."""
        cfg = self.config
        self.balance += cfg.explore_rate * committed
        if spent is not None:
            self.balance -= spent - committed
        self.balance = min(self.balance, cfg.explore_cap)
