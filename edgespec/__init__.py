"""edgespec: exact speculative decoding for local LLM chat (MLX and llama.cpp)."""

from .api import load
from .drafters import Draft, Drafter, DraftModel, PromptLookup
from .engine import Engine
from .generation import Chunk, Generation
from .errors import EdgespecError
from .sampling import SamplingParams, logits_to_probs
from .session import ChatSession
from .stats import GenerationStats
from .planning import AdaptivePlanner, FixedPlanner, Planner, PolicyConfig, Proposal, RoundResult
from .acceptance import Verdict, greedy_verify, rejection_sample

__version__ = "0.1.0"

__all__ = [
    "AdaptivePlanner", "ChatSession", "Chunk", "Draft", "Drafter", "DraftModel", "EdgespecError",
    "Engine", "FixedPlanner", "Generation", "GenerationStats", "Planner", "PolicyConfig", "PromptLookup", "Proposal",
    "RoundResult", "SamplingParams", "Verdict", "greedy_verify", "logits_to_probs", "load",
    "rejection_sample",
]
