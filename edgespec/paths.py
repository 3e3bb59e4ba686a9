"""Where edgespec keeps its files, and how a model file is told from another.

May import: nothing of edgespec.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def edgespec_home() -> Path:
    """Where weights and caches live: ``$EDGESPEC_HOME``, default ``~/.cache/edgespec``."""
    return Path(os.environ.get("EDGESPEC_HOME", Path.home() / ".cache" / "edgespec")).expanduser()


def file_fingerprint(path: str | Path, name: str | None = None) -> str:
    """A short hash of a model on disk: a file's size and header (its metadata), a
    folder's config and file sizes; ``name`` (or the path's text) where nothing is on
    disk there."""
    path = Path(str(path)).expanduser()
    label = str(name if name is not None else path)
    h = hashlib.sha256()
    try:
        if path.is_file():
            with open(path, "rb") as f:
                h.update(f"{path.stat().st_size}|".encode() + f.read(1 << 20))
        elif path.is_dir():
            for item in sorted(path.iterdir()):
                h.update(f"{item.name}|{item.stat().st_size}|".encode())
                if item.name == "config.json":
                    h.update(item.read_bytes())
        else:
            h.update(label.encode())
    except OSError:
        h.update(label.encode())
    return h.hexdigest()[:16]


# How many evenly spaced pieces of a model's bytes its identity reads, and their size.
_SAMPLES, _SAMPLE_BYTES = 32, 1 << 16


def model_identity(path: str | Path) -> str:
    """What tells a model's weights from every other's, wherever the file lies: a hash
    of its size, its first MiB (a GGUF's metadata and tensor table) and 32 pieces of
    64 KiB spread over the rest (the weights themselves, so two fine-tunes of one
    architecture and quantization differ); for a folder (an mlx-lm model), the same
    over each file, in name order. Its path is not part of it: a model moved or copied
    keeps its identity. About 3 MiB read per file."""
    path = Path(str(path)).expanduser()
    h = hashlib.sha256()
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    for file in files:
        size = file.stat().st_size
        h.update(f"{file.name if path.is_dir() else ''}|{size}|".encode())
        with open(file, "rb") as f:
            h.update(f.read(1 << 20))
            for i in range(1, _SAMPLES + 1):
                f.seek(size * i // (_SAMPLES + 1))
                h.update(f.read(_SAMPLE_BYTES))
    return h.hexdigest()[:32]
