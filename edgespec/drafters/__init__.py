"""Drafters: what proposes tokens for the target to verify."""

from .base import Draft, Drafter
from .draft_model import DraftModel
from .prompt_lookup import PromptLookup
from .suffix import SuffixDrafter

__all__ = ["Draft", "Drafter", "DraftModel", "PromptLookup", "SuffixDrafter"]
