"""Auto mode, assembled: a planner over prompt lookup and a drafter, starting from
this pair's costs on this machine, and what keeps its measurements for the next run.

The engine builds one when set to ``num_draft="auto"`` (after checking the pair),
and saves its costs when it closes.
"""

from __future__ import annotations

from pathlib import Path

from .backends.base import Backend
from .cache import CachedModel
from .calibration import pair_path, prior_for, save_calibration
from .costs import CostModel
from .drafters import PromptLookup
from .drafters.base import MODEL, Drafter
from .policy import AdaptivePlanner, PolicyConfig, auto_drafters


def auto_planner(target: Backend | CachedModel, drafter: Drafter | None,
                 config: PolicyConfig | None = None) -> AdaptivePlanner:
    """Auto mode over prompt lookup and ``drafter`` (a copying drafter takes lookup's
    place), from this pair's cached costs, or a short calibration the first time
    (through ``target``, and the draft model's own cache).

    A draft model with a stop of its own (``min_confidence``: the user's
    --draft-p-min) keeps it; otherwise it stops below the planner's ``draft_p_min``
    top probability at first, and the planner then moves the stop
    (:class:`~edgespec.policy.StopRule`).
    """
    models = _draft_models(drafter)
    if config is None:
        chosen = drafter.min_confidence if models else 0.0
        config = PolicyConfig(draft_p_min=chosen, learn_stop=False) if chosen else PolicyConfig()
    lookup = PromptLookup()
    lookup.attach(target.backend if isinstance(target, CachedModel) else target)
    return AdaptivePlanner(auto_drafters(drafter, lookup), CostModel(prior_for(target, models)), config)


def costs_path(target: Backend | CachedModel, drafter: Drafter | None) -> Path:
    """Where the costs of this pair on this machine are kept."""
    return pair_path(target, _draft_models(drafter))


def save_costs(planner: AdaptivePlanner, target: Backend | CachedModel, drafter: Drafter | None) -> None:
    """Keep what ``planner``'s run measured as the next run's prior (if it measured)."""
    if planner.cost.step_seconds is not None:
        save_calibration(planner.cost.as_prior(), costs_path(target, drafter))


def _draft_models(drafter: Drafter | None) -> list[tuple[str, CachedModel]]:
    """The draft model to time with the target, by the cache it drafts through."""
    cache = getattr(drafter, "cache", None) if drafter is not None and drafter.kind == MODEL else None
    return [(drafter.name, cache)] if cache is not None else []
