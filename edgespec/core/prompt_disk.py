"""Saved KV states on disk: conversations that survive a restart.

The prompt cache (:mod:`.prompt_cache`) keeps states in host RAM; this keeps them
in a folder, so that ``edgespec chat`` started again, a desktop app opened again or
``edgespec serve`` restarted restores a conversation's prompt instead of
evaluating it again. A state is bytes whose meaning depends on the model file,
the context size, the kernels and the KV cache type, so:

- each file is keyed by all of them (a backend's ``state_key``: the model's
  identity, not its path, then its settings), and the key is read back and
  compared before a byte of the state is used;
- a file is written whole or not at all: a temporary file, then a rename;
- it is checked by a hash (SHA-256 over the key, the tokens and the state) when
  it is read back;
- past the budget the least recently used files go first (a restore touches its
  file).

A file that fails a check is removed with a warning and the prompt is evaluated
instead: never a wrong state, never a crash. Two processes (a chat and a server)
may share one folder: the renames are atomic, and the budget is kept under a lock
file. What is written stays correct after a power loss too, or is refused by its
hash: nothing is synced to the disk before the rename, so a torn file can exist
but never passes the check.

A file: ``EDGESPEC-KV`` and the format's version byte, the header's length (4
bytes, little-endian), the header (JSON: key, tokens, usable prefix, state size,
hash), the state.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from ..errors import EdgespecError
from ..paths import edgespec_home
from .prefix import common_prefix_length

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: one process per folder is assumed
    fcntl = None

MAGIC = b"EDGESPEC-KV\x01"  # the last byte is the format's version
SUFFIX, PARTIAL, LOCK = ".kv", ".part", ".lock"
DEFAULT_MIB = 4096
ENV_BUDGET = "EDGESPEC_CACHE_DISK"  # the default --cache-disk, in MiB (0: off)

log = logging.getLogger("edgespec.cache")


def default_folder() -> Path:
    """Where saved prompts go unless ``--cache-dir`` says otherwise."""
    return edgespec_home() / "prompt-cache"


def default_budget_mib() -> int:
    """The disk budget unless ``--cache-disk`` says: ``$EDGESPEC_CACHE_DISK``, else 4 GiB."""
    value = os.environ.get(ENV_BUDGET)
    if value is None:
        return DEFAULT_MIB
    try:
        mib = int(value)
    except ValueError:
        mib = -1
    if mib < 0:
        raise EdgespecError(f"invalid ${ENV_BUDGET} {value!r}: MiB, an integer >= 0 (0 turns it off)")
    return mib


@dataclass
class DiskEntry:
    """A saved state in the folder: the tokens it holds, of which the first ``usable``
    may be restored (with exact kernels, those a cold prefill computes alike)."""

    path: Path
    key: str
    tokens: list[int]
    usable: int
    size: int  # the whole file's bytes


class PromptDisk:
    """Saved states in ``folder``, at most ``budget_bytes`` of files (0: off)."""

    def __init__(self, folder: str | os.PathLike, budget_bytes: int):
        if budget_bytes < 0:
            raise EdgespecError(f"invalid --cache-disk {budget_bytes // 2**20}: MiB, >= 0 (0 turns it off)")
        self.folder = Path(folder).expanduser()
        self.budget = int(budget_bytes)
        if self.budget:
            try:
                self.folder.mkdir(parents=True, exist_ok=True)
                (self.folder / LOCK).touch()
            except OSError as exc:
                raise EdgespecError(f"cannot use {self.folder} for saved prompts ({exc.strerror or exc}): "
                                    f"choose another --cache-dir, or --cache-disk 0") from None
        # Headers read so far, by file name, with the (inode, size) they were read at:
        # files never change in place (a new version is a new file renamed over it).
        self._headers: dict[str, tuple[tuple[int, int], DiskEntry]] = {}
        self._warned: set[str] = set()
        self.writes = self.hits = self.refused = 0

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    # -- finding and reading ----------------------------------------------------------

    def best(self, key: str, context: Sequence[int], *, min_tokens: int = 1) -> tuple[DiskEntry | None, int]:
        """The file of ``key`` whose usable tokens share the longest prefix with
        ``context`` (at least ``min_tokens``), and that length. A file of the same
        model that would have shared more, but was written with other settings,
        is named in a warning (it cannot be used)."""
        if not self.enabled:
            return None, 0
        found, length, other = None, 0, None
        for entry in self._entries(_model_part(key)):
            if _model_part(entry.key) != _model_part(key):  # (named as this model's, but is not)
                self._refuse(entry.path, "it belongs to another model")
                continue
            n = common_prefix_length(entry.tokens, context)
            if entry.key == key:
                n = min(n, entry.usable)
                if n > length:
                    found, length = entry, n
            elif n >= min_tokens and (other is None or n > other[1]):
                other = entry, n
        if other is not None and other[1] > length:
            self._warn_once(other[0].path.name, f"a saved prompt state of this conversation was written "
                            f"with other settings ({_difference(other[0].key, key)}): its prompt is "
                            f"evaluated instead")
        return (found, length) if length >= min_tokens else (None, 0)

    def read(self, entry: DiskEntry) -> np.ndarray | None:
        """The state of ``entry``, checked (None, with a warning, if it fails a check:
        the file is removed; None, silently, if another process removed or replaced it
        since it was listed). Touches the file: it was used."""
        try:
            with open(entry.path, "rb") as f:
                header, offset = _read_header(f)
                if header.get("key") != entry.key:
                    return self._refuse(entry.path, "it belongs to another model or settings")
                if header["tokens"] != entry.tokens or header["usable"] != entry.usable:
                    return None  # (replaced meanwhile by another process's write: a miss)
                nbytes = int(header["state_bytes"])
                if nbytes != os.fstat(f.fileno()).st_size - offset:  # (before allocating it)
                    return self._refuse(entry.path, "its length is not the one its header gives: truncated")
                data = bytearray(nbytes)
                if f.readinto(data) != nbytes:
                    return self._refuse(entry.path, "its length is not the one its header gives: truncated")
            if _digest(header["key"], header["tokens"], header["usable"], data) != header.get("sha256"):
                return self._refuse(entry.path, "its hash does not match: a damaged byte")
        except FileNotFoundError:
            return None  # another process evicted it meanwhile: a miss
        except (OSError, ValueError, KeyError, TypeError, OverflowError) as exc:
            return self._refuse(entry.path, f"unreadable: {exc}")
        with contextlib.suppress(OSError):
            os.utime(entry.path)
        self.hits += 1
        return np.frombuffer(data, dtype=np.uint8)

    def holds(self, key: str, tokens: Sequence[int], usable: int) -> bool:
        """Whether a file of ``key`` already holds ``tokens`` (or more), at least as usable."""
        n = len(tokens)
        return any(e.key == key and len(e.tokens) >= n and e.usable >= usable
                   and common_prefix_length(e.tokens, tokens) == n for e in self._entries(_model_part(key)))

    # -- writing ----------------------------------------------------------------------

    def write(self, key: str, tokens: Sequence[int], usable: int, state: np.ndarray) -> bool:
        """Keep ``state`` (holding ``tokens`` of ``key``, the first ``usable`` of them
        restorable) in a file, written whole, then the least recently used files removed
        past the budget, and the files of the same conversation it extends. False (with a
        warning) where it is not kept: larger than the budget, or the disk refused it."""
        if not self.enabled:
            return False
        tokens = [int(t) for t in tokens]
        state = np.ascontiguousarray(state).view(np.uint8).reshape(-1)
        if self.holds(key, tokens, usable):
            return True
        header = json.dumps({"key": key, "tokens": tokens, "usable": int(usable),
                             "state_bytes": int(state.nbytes),
                             "sha256": _digest(key, tokens, usable, state)}).encode()
        size = len(MAGIC) + 4 + len(header) + state.nbytes
        if size > self.budget:
            self._warn_once("budget", f"a saved prompt state of {size / 2**20:.0f} MiB does not fit "
                            f"--cache-disk {self.budget / 2**20:.0f} MiB: it is not kept on disk "
                            f"(raise --cache-disk)")
            return False
        name = f"{_hash(_model_part(key))[:12]}-{_hash(key)[:12]}-{_hash(tokens)[:16]}{SUFFIX}"
        part = self.folder / f".{name}.{os.getpid()}.{os.urandom(4).hex()}{PARTIAL}"
        try:
            # Made and locked under the folder's lock, where another process's eviction
            # looks: a part file nobody holds is a dead writer's, never one just opened.
            with self._locked():
                f = open(part, "wb")
                try:
                    if fcntl is not None:  # held while it is written
                        fcntl.flock(f, fcntl.LOCK_EX)
                except OSError:
                    f.close()
                    raise
            with f:
                f.write(MAGIC + struct.pack("<I", len(header)) + header)
                f.write(memoryview(state))
                with self._locked():
                    os.replace(part, self.folder / name)
        except OSError as exc:
            with contextlib.suppress(OSError):
                part.unlink()
            self._warn_once("write", f"could not save a prompt state in {self.folder} "
                            f"({exc.strerror or exc}): it is evaluated again after a restart")
            return False
        self.writes += 1
        try:
            with self._locked():
                self._evict(keep=name, key=key, tokens=tokens, usable=usable)
        except OSError as exc:  # (the state is written; the folder may stay over budget until the next write)
            self._warn_once("evict", f"could not remove old prompt states in {self.folder} "
                            f"({exc.strerror or exc})")
        return True

    def remove(self, entry: DiskEntry) -> None:
        """Drop ``entry``'s file (a state the backend refused)."""
        with contextlib.suppress(OSError):
            entry.path.unlink()
        self._headers.pop(entry.path.name, None)

    def size(self) -> int:
        """Bytes the folder's states (and writes in progress) take now."""
        return sum(size for _, size, _ in self._files(with_partial=True))

    # -- the folder -------------------------------------------------------------------

    def _entries(self, model: str) -> Iterator[DiskEntry]:
        """Each readable file of ``model`` (a damaged header: removed, with a warning)."""
        prefix = _hash(model)[:12] + "-"
        try:
            names = [n for n in os.listdir(self.folder) if n.startswith(prefix) and n.endswith(SUFFIX)]
        except OSError:
            return
        for gone in [n for n in self._headers if n.startswith(prefix) and n not in names]:
            del self._headers[gone]  # (removed by another process)
        for name in names:
            path = self.folder / name
            try:
                stat = path.stat()
                stamp = (stat.st_ino, stat.st_size)
                cached = self._headers.get(name)
                if cached is None or cached[0] != stamp:
                    with open(path, "rb") as f:
                        header, _ = _read_header(f)
                    entry = DiskEntry(path, str(header["key"]), [int(t) for t in header["tokens"]],
                                      int(header["usable"]), stat.st_size)
                    self._headers[name] = (stamp, entry)
                yield self._headers[name][1]
            except FileNotFoundError:
                self._headers.pop(name, None)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                self._refuse(path, f"unreadable header: {exc}")

    def _files(self, *, with_partial: bool = False) -> list[tuple[float, int, Path]]:
        """(last used, bytes, path) of every state file (and writes in progress); none
        where the folder cannot be read."""
        found = []
        try:
            names = os.listdir(self.folder)
        except OSError:
            return found
        for name in names:
            if name.endswith(SUFFIX) or (with_partial and name.endswith(PARTIAL)):
                path = self.folder / name
                with contextlib.suppress(OSError):
                    stat = path.stat()
                    found.append((stat.st_mtime, stat.st_size, path))
        return found

    def _evict(self, *, keep: str, key: str, tokens: list[int], usable: int) -> None:
        """(Under the lock.) Remove what a process killed mid-write left, the files of
        this conversation that ``keep`` extends, then the least recently used until the
        folder is within the budget."""
        for _, _, path in self._files(with_partial=True):
            if path.name.endswith(PARTIAL) and _abandoned(path):
                with contextlib.suppress(OSError):
                    path.unlink()
        for entry in list(self._entries(_model_part(key))):
            if entry.path.name != keep and entry.key == key and len(entry.tokens) <= len(tokens) \
                    and entry.usable <= usable and common_prefix_length(entry.tokens, tokens) == len(entry.tokens):
                self.remove(entry)
        files = sorted(self._files(with_partial=True))
        held = sum(size for _, size, _ in files)
        for _, size, path in files:
            if held <= self.budget:
                break
            if path.name == keep or path.name.endswith(PARTIAL):
                continue  # (the newest, and another process's write in progress)
            try:
                path.unlink()
            except FileNotFoundError:
                pass  # (removed by another process: its bytes are gone too)
            except OSError:
                continue
            self._headers.pop(path.name, None)
            held -= size

    @contextlib.contextmanager
    def _locked(self):
        """The folder's lock (between processes; a no-op where there is no flock)."""
        with open(self.folder / LOCK, "a") as f:
            if fcntl is not None:
                fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                if fcntl is not None:
                    fcntl.flock(f, fcntl.LOCK_UN)

    def _refuse(self, path: Path, why: str) -> None:
        """Remove a file that failed a check, and say so."""
        self.refused += 1
        with contextlib.suppress(OSError):
            path.unlink()
        self._headers.pop(path.name, None)
        log.warning("the saved prompt state %s was refused (%s): removed; the prompt is evaluated "
                    "instead", path.name, why)
        return None

    def _warn_once(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning("%s", message)


def _read_header(f) -> tuple[dict, int]:
    """The header of an open state file, and where its state starts."""
    start = f.read(len(MAGIC) + 4)
    if len(start) < len(MAGIC) + 4 or start[:len(MAGIC)] != MAGIC:
        raise ValueError("not an edgespec state file of this version")
    (length,) = struct.unpack("<I", start[len(MAGIC):])
    raw = f.read(length)
    if len(raw) != length:
        raise ValueError("truncated header")
    header = json.loads(raw)
    if not isinstance(header, dict) or not isinstance(header.get("tokens"), list):
        raise ValueError("no token list in the header")
    return header, len(MAGIC) + 4 + length


def _digest(key: str, tokens: Sequence[int], usable: int, state) -> str:
    h = hashlib.sha256()  # (SHA-NI makes it the fastest of hashlib's on x86: ~1 GB/s)
    h.update(key.encode())
    h.update(np.asarray(tokens, dtype=np.int64).tobytes())
    h.update(struct.pack("<q", int(usable)))
    h.update(memoryview(state))
    return h.hexdigest()


def _hash(value) -> str:
    data = value.encode() if isinstance(value, str) else np.asarray(value, dtype=np.int64).tobytes()
    return hashlib.sha256(data).hexdigest()


def _model_part(key: str) -> str:
    """A state key's model identity (its first field): files of one model share it."""
    return key.split("|", 1)[0]


def _difference(saved: str, wanted: str) -> str:
    """The settings in which two keys of one model differ, readably."""
    pairs = [(a, b) for a, b in zip(saved.split("|")[1:], wanted.split("|")[1:]) if a != b]
    return ", ".join(f"{a} there, {b} here" for a, b in pairs) or "another build"


def _abandoned(path: Path) -> bool:
    """Whether a ``.part`` file is a dead writer's: nobody holds its lock (a writer holds
    it until its rename); without flock (Windows), once it is an hour old."""
    try:
        if fcntl is None:
            return time.time() - path.stat().st_mtime > 3600
        with open(path, "rb") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            fcntl.flock(f, fcntl.LOCK_UN)
            return True
    except OSError:
        return False
