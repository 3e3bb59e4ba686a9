"""Drafters: what proposes tokens for the target to verify.

``registry.py`` (the one name table: a ``-d`` name or a request's drafter to a
drafter), ``prompt_lookup.py``, ``suffix.py``, ``copying.py`` and ``breaks.py`` (long
copies), ``prediction.py`` (Predicted Outputs), ``draft_model.py``, ``last_line.py``
(the example), ``scheduled.py`` (the ceiling's). The protocol they implement is
:mod:`edgespec.core.draft`.

May import: backends, core, errors, paths.
"""

from ..core.draft import Draft, Drafter
from .draft_model import DraftModel
from .prompt_lookup import PromptLookup
from .suffix import SuffixDrafter

__all__ = ["Draft", "Drafter", "DraftModel", "PromptLookup", "SuffixDrafter"]
