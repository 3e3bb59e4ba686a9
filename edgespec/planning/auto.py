"""Auto mode, assembled: a planner over prompt lookup and a drafter, starting from
this pair's costs on this machine, which it keeps for the next run when it closes.

The engine builds one when set to ``num_draft="auto"`` (after checking the pair), and
so do bench and the scripts: one assembly, wherever auto mode runs.
"""

from __future__ import annotations

from pathlib import Path

from ..backends.base import Backend
from ..cache import CachedModel
from ..calibration import pair_path, prior_for
from ..costs import CostModel
from ..drafters import PromptLookup
from ..drafters.base import MODEL, Drafter
from .adaptive import AdaptivePlanner, auto_drafters
from .config import PolicyConfig


def auto_planner(target: Backend | CachedModel, drafter: Drafter | None,
                 config: PolicyConfig | None = None, *, prior: dict | None = None,
                 cheap: Drafter | None = None) -> AdaptivePlanner:
    """Auto mode over a drafter that costs nothing to ask (``cheap``: prompt lookup
    unless given; a copying ``drafter`` takes its place) and ``drafter``, from this
    pair's cached costs, or a short calibration the first time (through ``target``,
    and the draft model's own cache); closing the planner keeps what its run measured
    for the next. With a ``prior`` (a benchmark's or a script's own costs) it starts
    from those and keeps nothing.

    A draft model with a stop of its own (``min_confidence``: the user's
    --draft-p-min) keeps it; otherwise it stops below the planner's ``draft_p_min``
    top probability at first, and the planner then moves the stop
    (:class:`~edgespec.planning.StopRule`).
    """
    models = _draft_models(drafter)
    if config is None:
        chosen = drafter.min_confidence if models else 0.0
        config = PolicyConfig(draft_p_min=chosen, learn_stop=False) if chosen else PolicyConfig()
    if cheap is None:
        cheap = PromptLookup()
        cheap.attach(target.backend if isinstance(target, CachedModel) else target)
    kept = pair_path(target, models) if prior is None else None
    return AdaptivePlanner(auto_drafters(drafter, cheap), CostModel(prior or prior_for(target, models)),
                           config, keep_costs=kept)


def costs_path(target: Backend | CachedModel, drafter: Drafter | None) -> Path:
    """Where the costs of this pair on this machine are kept."""
    return pair_path(target, _draft_models(drafter))


def _draft_models(drafter: Drafter | None) -> list[tuple[str, CachedModel]]:
    """The draft model to time with the target, by the cache it drafts through."""
    cache = drafter.cache if drafter is not None and drafter.kind == MODEL else None
    return [(drafter.name, cache)] if cache is not None else []
