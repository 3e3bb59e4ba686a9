"""edgespec: exact speculative decoding for local LLM chat (MLX and llama.cpp)."""

from .api import load
from .drafters import Draft, Drafter, DraftModel, PromptLookup
from .engine import Chunk, Engine, Generation
from .errors import EdgespecError
from .sampling import SamplingParams, logits_to_probs
from .session import ChatSession
from .stats import GenerationStats
from .verify import greedy_verify, rejection_sample

__version__ = "0.1.0"

__all__ = [
    "ChatSession", "Chunk", "Draft", "Drafter", "DraftModel", "EdgespecError", "Engine", "Generation",
    "GenerationStats", "PromptLookup", "SamplingParams", "greedy_verify", "logits_to_probs",
    "load", "rejection_sample",
]
