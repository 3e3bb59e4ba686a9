"""The planner: which drafter drafts how far each round (auto mode), and what it
knows of this machine's costs.

- auto mode (its tunables, :class:`PlannerConfig`, are :mod:`edgespec.core.config`'s): :mod:`.estimates`
  (acceptance and offer rates, a draft model's stop), :mod:`.budget` (what tries made
  on hope may lose), :mod:`.adaptive` (:class:`AdaptivePlanner`);
- its costs: :mod:`.costs` (:class:`CostModel`: v(n) and c, measured in the run),
  :mod:`.calibration` (timing a pair, and the cost files kept between runs);
- :mod:`.factory`: auto mode assembled (:class:`AutoPlanners`, the planners an engine
  is handed: one per drafter, its costs loaded or calibrated, its long passes timed,
  kept when it closes).

The interface the engine asks (``Planner``, ``Proposal``, ``RoundResult``,
``FixedPlanner``) is :mod:`edgespec.core.planner`.

May import: drafters, backends, core, errors, paths.
"""

from ..core.planner import DraftReport, FixedPlanner, Planner, Proposal, RoundResult
from .adaptive import AdaptivePlanner, auto_drafters
from ..core.config import PlannerConfig
from .estimates import AcceptanceTracker, Rates, StopRule
from .factory import AutoPlanners, auto_planner

__all__ = ["AcceptanceTracker", "AdaptivePlanner", "AutoPlanners", "DraftReport", "FixedPlanner",
           "Planner", "PlannerConfig", "Proposal", "Rates", "RoundResult", "StopRule", "auto_drafters",
           "auto_planner"]
