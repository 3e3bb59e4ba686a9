"""edgespec: exact speculative decoding for local LLM chat (MLX and llama.cpp).

The packages are layers, each importing only those below it (``tests/test_layout.py``
reads each one's "May import" line and checks it): ``errors`` and ``paths`` at the
bottom; ``core`` (the round loop, the exact math, the contracts); ``backends``;
``drafters``; ``planner``; ``models``; ``measure``; ``api`` and ``session``; ``serve``;
``cli`` at the top (docs/design.md).

May import: api, session, planner, drafters, core, errors.
"""

from .api import load
from .drafters import Draft, Drafter, DraftModel, PromptLookup
from .core.engine import Engine
from .core.generation import Chunk, Generation
from .errors import EdgespecError
from .core.sampling import SamplingParams, logits_to_probs
from .session import ChatSession
from .core.stats import GenerationStats
from .planner import AdaptivePlanner, FixedPlanner, Planner, PlannerConfig, Proposal, RoundResult
from .core.acceptance import Verdict, greedy_verify, rejection_sample

__version__ = "0.1.0"

__all__ = [
    "AdaptivePlanner", "ChatSession", "Chunk", "Draft", "Drafter", "DraftModel", "EdgespecError",
    "Engine", "FixedPlanner", "Generation", "GenerationStats", "Planner", "PlannerConfig", "PromptLookup", "Proposal",
    "RoundResult", "SamplingParams", "Verdict", "greedy_verify", "logits_to_probs", "load",
    "rejection_sample",
]
