"""Saved KV states of earlier prompts, in host RAM: what a client will send again.

A client interleaves conversations: an assistant's edit, a side request that
summarizes the chat history, then the next edit, which repeats the first one's
prompt. One KV cache holds one of them at a time. This keeps the others as
saved states (llama.cpp's ``llama_state_seq_get_data``; MLX's cache arrays)
within a byte budget, as llama-server's ``--cache-ram`` does: a model's cache
saves what a new prompt would drop (:meth:`edgespec.core.cache.CachedModel.reuse`),
and a new prompt brings back the saved state that shares its longest prefix.
The least recently used state goes first when the budget is full.

The budget is for everything conversations leave behind in host RAM, not the states
alone: the drafters' memory of other conversations (prompt lookup's and the suffix
drafter's copy indexes, the suffix drafter's counts) counts in it too, and after each
generation (:meth:`PromptCache.settle`) the least recently used piece goes, whoever
holds it, until all of it fits.

Below RAM there may be a folder (:mod:`.prompt_disk`): a state leaves RAM for it
when it is evicted, and every state still held goes there when the engine closes
(:meth:`PromptCache.flush`), so a conversation survives a restart. A lookup takes
the longest prefix there is, RAM first at equal lengths.

A restored state is the very bytes that were saved. With exact kernels only its
``usable`` prefix is restored: the tokens a cold prefill computes in the same
passes (:class:`~edgespec.core.cache.CachedModel`), so the logits after it are a cold
run's, bit for bit. Only a prefix is reused unless ``--cache-reuse`` asks for shifted
chunks too, which is not exact (docs/exactness.md).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from .host_memory import give_back, map_large_buffers
from .prefix import common_prefix_length
from .prompt_disk import DiskEntry, PromptDisk, log

__all__ = ["PromptCache", "PromptCacheStats", "SavedPrompt", "common_prefix_length", "default_budget_mib"]


# Fewer tokens than this are not worth a save or a restore: evaluating them costs
# about what copying their state does, and small states would crowd the budget.
MIN_TOKENS = 64
# The default budget: llama-server's --cache-ram default, or a quarter of the RAM on a
# smaller machine (the models and the OS need the rest).
DEFAULT_MIB = 8192


def default_budget_mib() -> int:
    """The prompt cache's default budget on this machine, in MiB."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # (not on every platform)
        return DEFAULT_MIB // 4
    return min(DEFAULT_MIB, ram // 4 // 2**20)


@dataclass
class SavedPrompt:
    """One saved KV state: the tokens it holds, for which model."""

    model: str  # the model and context it was saved from (CachedModel.key)
    tokens: list[int]
    state: object  # what the backend's save_state returned
    nbytes: int
    used: int  # the cache's clock when last saved or restored (LRU order)
    usable: int = -1  # how many of the tokens may be restored (-1: all of them)
    # The state as bytes for a file (the backend's state_bytes); None: never on disk.
    dump: Callable[[object], np.ndarray] | None = None
    on_disk: bool = False  # already written to the folder
    used_at: float = 0.0  # time.monotonic() when last saved or restored (the drafters' clock)

    def __post_init__(self):
        if self.usable < 0:
            self.usable = len(self.tokens)


@dataclass
class PromptCacheStats:
    """What a prompt cache did, for ``/metrics``."""

    hits: int = 0  # lookups that restored a saved state
    misses: int = 0  # lookups that found none sharing enough of the prompt
    evictions: int = 0  # states dropped for room
    saves: int = 0
    restored_tokens: int = 0  # prompt tokens brought back instead of evaluated
    bytes: int = 0  # held now
    entries: int = 0  # held now
    disk_hits: int = 0  # of the hits, restored from the folder
    disk_writes: int = 0  # states written to the folder
    disk_refused: int = 0  # files that failed a check (removed; the prompt evaluated)
    disk_bytes: int = 0  # the folder's size now


class PromptCache:
    """Saved prompts of one or more models (a target and its draft model share one
    budget), the most recently used kept, within ``budget_bytes`` (0: off).

    ``shift_min`` (llama-server's ``--cache-reuse``; 0, the default: off): cached chunks
    of at least that many tokens that reappear after a divergence are moved into place
    by KV shift (:meth:`edgespec.core.cache.CachedModel.reuse`). It holds whether or
    not states are saved (a budget of 0), and never with exact kernels.

    ``disk``: the folder below RAM (None: none).

    Thread-safe: a server's worker saves and restores while ``/metrics`` reads.
    """

    def __init__(self, budget_bytes: int, *, min_tokens: int = MIN_TOKENS, shift_min: int = 0,
                 disk: PromptDisk | None = None):
        if budget_bytes < 0:
            raise ValueError(f"invalid prompt cache budget {budget_bytes}: must be >= 0 bytes")
        if shift_min < 0:
            raise ValueError(f"invalid cache reuse {shift_min}: a chunk of >= 0 tokens (0: off)")
        self.budget = int(budget_bytes)
        if self.budget:
            map_large_buffers()  # (states are made and dropped all along: see host_memory)
        self.min_tokens = min_tokens
        self.shift_min = int(shift_min)
        self.disk = disk if disk is not None and disk.enabled else None
        self._saved: list[SavedPrompt] = []
        self._clock = 0
        self._lock = threading.Lock()  # the RAM entries and counters
        self._disk_lock = threading.Lock()  # the folder's calls (never held with the other)
        self._stats = PromptCacheStats()
        self._holders: weakref.WeakSet = weakref.WeakSet()  # drafters whose memory counts here
        self._others: dict[str, int] = {}  # their bytes by part, as last measured

    @property
    def enabled(self) -> bool:
        """Whether states are kept anywhere (RAM or the folder)."""
        return self.budget > 0 or self.disk is not None

    def stats(self) -> PromptCacheStats:
        """A copy of the counters, with what is held now."""
        with self._lock:
            s = PromptCacheStats(**vars(self._stats))
            s.bytes, s.entries = self._held(), len(self._saved)
            if self.disk is not None:
                s.disk_refused, s.disk_bytes = self.disk.refused, self.disk.size()
            return s

    def best(self, model: str, context: Sequence[int]) -> tuple[SavedPrompt | DiskEntry | None, int]:
        """The saved state of ``model`` whose usable tokens share the longest prefix with
        ``context`` (in RAM, the most recent of equals; then in the folder, if longer),
        and that length; (None, 0) if none is saved."""
        with self._lock:
            found, length = None, 0
            for entry in reversed(self._saved):  # most recently used first
                if entry.model == model:
                    n = min(common_prefix_length(entry.tokens, context), entry.usable)
                    if n > length:
                        found, length = entry, n
        if self.disk is not None:
            with self._disk_lock:
                on_disk, n = self.disk.best(model, context, min_tokens=max(length + 1, self.min_tokens))
            if on_disk is not None:
                found, length = on_disk, n
        return found, length

    def read(self, entry: DiskEntry) -> np.ndarray | None:
        """A state from the folder, checked (None: it failed a check and was removed, or
        another process removed it)."""
        if self.disk is None:
            return None
        with self._disk_lock:
            return self.disk.read(entry)

    def forget(self, entry: DiskEntry) -> None:
        """Remove a file whose state the backend refused."""
        if self.disk is not None:
            with self._disk_lock:
                self.disk.remove(entry)

    def looked_up(self, entry: SavedPrompt | DiskEntry | None, restored_tokens: int = 0) -> None:
        """Count a lookup: ``entry`` was restored (a hit), or None was (a miss)."""
        with self._lock:
            if entry is None:
                self._stats.misses += 1
                return
            self._stats.hits += 1
            self._stats.restored_tokens += restored_tokens
            if isinstance(entry, DiskEntry):
                self._stats.disk_hits += 1
                return
            self._clock += 1
            entry.used, entry.used_at = self._clock, time.monotonic()

    def holds(self, model: str, tokens: Sequence[int], usable: int | None = None) -> bool:
        """Whether a saved state of ``model`` in RAM already holds ``tokens`` (or more),
        with at least ``usable`` of them restorable (None: all)."""
        usable = len(tokens) if usable is None else usable
        with self._lock:
            return any(e.model == model and len(e.tokens) >= len(tokens) and e.usable >= usable
                       and common_prefix_length(e.tokens, tokens) == len(tokens) for e in self._saved)

    def save(self, model: str, tokens: Sequence[int], state: object, nbytes: int, *,
             usable: int | None = None, dump: Callable[[object], np.ndarray] | None = None) -> bool:
        """Keep ``state`` (holding ``tokens`` of ``model``, of which ``usable`` may be
        restored; None: all), dropping the saved states it extends and then the least
        recently used until it fits: those go to the folder, if there is one and ``dump``
        makes their bytes. A state larger than the whole RAM budget goes there at once.
        False if it is kept nowhere."""
        entry = SavedPrompt(model, list(tokens), state, int(nbytes), 0,
                            len(tokens) if usable is None else usable, dump)
        room = self.budget - sum(self._others.values())  # (what the drafters held, last measured)
        if nbytes > room:
            return self._spill([entry]) > 0
        with self._lock:
            # A state this one extends is superseded: the same conversation, shorter.
            self._saved = [e for e in self._saved if not (
                e.model == model and len(e.tokens) <= len(entry.tokens) and e.usable <= entry.usable
                and common_prefix_length(e.tokens, entry.tokens) == len(e.tokens))]
            held = self._held()
            self._saved.sort(key=lambda e: e.used)
            evicted = []
            while self._saved and held + nbytes > room:
                evicted.append(self._saved.pop(0))
                held -= evicted[-1].nbytes
                self._stats.evictions += 1
            self._clock += 1
            entry.used, entry.used_at = self._clock, time.monotonic()
            self._saved.append(entry)
            self._stats.saves += 1
        self._spill(evicted)  # (outside the lock: /metrics reads the counters meanwhile)
        return True

    def settle(self, drafters: Sequence = ()) -> None:
        """Bring what conversations leave behind within the budget: the states held here
        and the memory of ``drafters`` and of every drafter seen before (their
        ``memory()``: copy indexes, counts, a draft model's logits). The least recently
        used piece goes first, a state (to the folder, if any) or a drafter's other
        conversation, until it all fits or nothing more may go (the live conversation's
        indexes stay). The engine calls it after each generation."""
        if self.budget == 0:
            return
        self._holders.update(drafters)
        while True:
            others: dict[str, int] = {}
            for holder in list(self._holders):
                for part, n in holder.memory().items():
                    others[part] = others.get(part, 0) + n
            self._others = others
            with self._lock:
                held = self._held()
                state = min(self._saved, key=lambda e: e.used, default=None)
            if held + sum(others.values()) <= self.budget:
                break
            dated = [(h.oldest_memory(), i, h) for i, h in enumerate(self._holders)]
            when, _, holder = min([d for d in dated if d[0] is not None], default=(None, 0, None))
            if state is not None and (holder is None or state.used_at <= when):
                with self._lock:
                    self._saved.remove(state)
                    self._stats.evictions += 1
                self._spill([state])
            elif holder is not None:
                holder.drop_oldest_memory()
            else:
                break  # (only the live conversations' memory is left)
        give_back()  # what went since the last time left holes in the heap (host_memory)

    def memory(self) -> dict[str, int]:
        """Bytes held by part: ``prompt_states`` here, and the drafters' (as last
        measured by :meth:`settle`)."""
        with self._lock:
            return {"prompt_states": self._held(), **self._others}

    def _held(self) -> int:
        """Bytes of the states in RAM (called with the lock held)."""
        return sum(e.nbytes for e in self._saved)

    def flush(self, live: Sequence = ()) -> int:
        """With a folder: save what the ``live`` caches hold (``CachedModel``s: the
        conversations in the models), then write every state held in RAM that is not in
        the folder yet (the least recently used first, so the folder's order is RAM's);
        how many were written. The engine calls this when it closes; it never raises (a
        state not written is a warning: saved prompts are a speed-up)."""
        if self.disk is None:
            return 0
        try:
            for cache in live:
                cache.keep()
            with self._lock:
                held = sorted(self._saved, key=lambda e: e.used)
            return self._spill(held)
        except Exception as exc:  # noqa: BLE001
            log.warning("the saved prompts could not be written (%s: %s)", type(exc).__name__, exc)
            return 0

    def _spill(self, entries: list[SavedPrompt]) -> int:
        """Write ``entries`` to the folder (a state that cannot be made bytes, say for
        want of memory, is left out with a warning); how many were written."""
        written = 0
        for entry in entries:
            if self.disk is None or entry.dump is None or entry.on_disk:
                continue
            try:
                state = entry.dump(entry.state)
            except Exception as exc:  # noqa: BLE001 - a state not kept is a cold prefill later, not a failure now
                log.warning("a saved prompt state could not be written to the folder (%s: %s)",
                            type(exc).__name__, exc)
                continue
            with self._disk_lock:
                entry.on_disk = self.disk.write(entry.model, entry.tokens, entry.usable, state)
            written += entry.on_disk
        with self._lock:
            self._stats.disk_writes += written
        return written

    def clear(self) -> None:
        """Drop every saved state in RAM (their memory goes with them)."""
        with self._lock:
            self._saved.clear()
