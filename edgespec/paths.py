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
