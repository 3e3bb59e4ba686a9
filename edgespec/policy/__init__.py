"""Auto mode: which drafter drafts how far each round, from this run's evidence.

- :mod:`.config`: the tunables (:class:`PolicyConfig`);
- :mod:`.estimates`: acceptance and offer rates, and a draft model's stop;
- :mod:`.budget`: what tries made on hope may lose;
- :mod:`.planner`: :class:`AdaptivePlanner`, the planner the engine asks.
"""

from .config import PolicyConfig
from .estimates import AcceptanceTracker, Rates, StopRule
from .planner import AdaptivePlanner, auto_drafters

__all__ = ["AcceptanceTracker", "AdaptivePlanner", "PolicyConfig", "Rates", "StopRule", "auto_drafters"]
