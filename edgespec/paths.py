"""Where edgespec keeps its files, and how a model file is told from another.

May import: nothing of edgespec.
"""

from __future__ import annotations

import hashlib
import json
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


def model_identity(path: str | Path) -> str:
    """What tells a model's weights from every other's, wherever the file lies: a SHA-256
    of all its bytes (for a folder, an mlx-lm model, of each file's name and bytes in
    name order). Its path is not part of it: a model moved or copied keeps its identity.
    Hashing reads the whole model once (about a second per GB); the result is kept in
    ``$EDGESPEC_HOME/identities.json`` under the file's device, inode, size and
    modification time, so a model changed in place is hashed again."""
    path = Path(str(path)).expanduser()
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    stamps = "|".join(f"{f.name}:{s.st_dev}:{s.st_ino}:{s.st_size}:{s.st_mtime_ns}"
                      for f in files for s in [f.stat()])
    store = edgespec_home() / "identities.json"
    try:
        known = json.loads(store.read_text())
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict):
        known = {}
    if isinstance(known.get(stamps), str):
        return known[stamps]
    h = hashlib.sha256()
    for file in files:
        if path.is_dir():
            h.update(f"{file.name}|".encode())
        with open(file, "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
    identity = h.hexdigest()[:32]
    known[stamps] = identity
    try:  # (written whole; two processes at once lose at most an entry, hashed again later)
        store.parent.mkdir(parents=True, exist_ok=True)
        tmp = store.with_name(f".{store.name}.{os.getpid()}")
        tmp.write_text(json.dumps(dict(list(known.items())[-256:])))
        os.replace(tmp, store)
    except OSError:
        pass
    return identity
