"""What a model argument names, and which backend runs it.

A model argument is a GGUF file, an MLX model folder, a Hugging Face repository id
(``org/name``) or a name from ``edgespec models list`` (:func:`edgespec.models.catalog.resolve_model`
turns a name into a file). The CLI, the API, the bench and the MLX backend all ask here.
"""

from __future__ import annotations

import platform
import sys
from pathlib import Path

BACKENDS = ("auto", "llama.cpp", "mlx")


def on_apple_silicon() -> bool:
    """True on an Apple Silicon Mac, where MLX runs on Metal."""
    return sys.platform == "darwin" and platform.machine() == "arm64"


def looks_like_hub_id(spec: str) -> bool:
    """``org/name`` with no file suffix: a Hugging Face repository id."""
    parts = spec.split("/")
    return len(parts) == 2 and all(parts) and not spec.endswith(".gguf") and not spec.startswith(".")


def pick_backend(spec: str, requested: str) -> str:
    """The backend that runs ``spec``: as requested, or for ``auto`` MLX on
    Apple Silicon and for MLX model directories / Hub ids, llama.cpp elsewhere."""
    if requested != "auto":
        return requested
    path = Path(spec).expanduser()
    if path.is_dir() or (looks_like_hub_id(spec) and not path.exists()):
        return "mlx"  # an MLX model directory or a Hugging Face repo id
    if on_apple_silicon():
        try:
            import mlx.core  # noqa: F401
            return "mlx"
        except ImportError:
            pass
    return "llama.cpp"
