"""Planning: which drafter drafts how far each round.

- :mod:`.base`: the planning interface the engine asks (:class:`Proposal`,
  :class:`DraftReport`, :class:`RoundResult`, :class:`Planner`) and :class:`FixedPlanner`;
- auto mode: :mod:`.config` (the tunables, :class:`PolicyConfig`), :mod:`.estimates`
  (acceptance and offer rates, a draft model's stop), :mod:`.budget` (what tries made
  on hope may lose), :mod:`.adaptive` (:class:`AdaptivePlanner`), and :mod:`.auto`
  (auto mode assembled: the planner, this pair's costs, kept for the next run).
"""

from .adaptive import AdaptivePlanner, auto_drafters
from .base import DraftReport, FixedPlanner, Planner, Proposal, RoundResult
from .config import PolicyConfig
from .estimates import AcceptanceTracker, Rates, StopRule

__all__ = ["AcceptanceTracker", "AdaptivePlanner", "DraftReport", "FixedPlanner", "Planner",
           "PolicyConfig", "Proposal", "Rates", "RoundResult", "StopRule", "auto_drafters"]
