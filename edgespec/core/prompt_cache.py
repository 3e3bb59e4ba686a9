"""Saved KV states of earlier prompts, in host RAM: what a client will send again.

A client interleaves conversations: an assistant's edit, a side request that
summarizes the chat history, then the next edit, which repeats the first one's
prompt. One KV cache holds one of them at a time. This keeps the others as
saved states (llama.cpp's ``llama_state_seq_get_data``; MLX's cache arrays)
within a byte budget, as llama-server's ``--cache-ram`` does: a model's cache
saves what a new prompt would drop (:meth:`edgespec.core.cache.CachedModel.reuse`),
and a new prompt brings back the saved state that shares its longest prefix.
The least recently used state goes first when the budget is full.

A restored state is the very bytes that were saved, so the logits after it are
the ones a cold run computes over the same tokens (bit for bit with exact
kernels). Only a prefix is reused unless ``--cache-reuse`` asks for shifted chunks
too, which is not exact (docs/exactness.md).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Sequence


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


class PromptCache:
    """Saved prompts of one or more models (a target and its draft model share one
    budget), the most recently used kept, within ``budget_bytes`` (0: off).

    ``shift_min`` (llama-server's ``--cache-reuse``; 0, the default: off): cached chunks
    of at least that many tokens that reappear after a divergence are moved into place
    by KV shift (:meth:`edgespec.core.cache.CachedModel.reuse`). It holds whether or
    not states are saved (a budget of 0), and never with exact kernels.

    Thread-safe: a server's worker saves and restores while ``/metrics`` reads.
    """

    def __init__(self, budget_bytes: int, *, min_tokens: int = MIN_TOKENS, shift_min: int = 0):
        if budget_bytes < 0:
            raise ValueError(f"invalid prompt cache budget {budget_bytes}: must be >= 0 bytes")
        if shift_min < 0:
            raise ValueError(f"invalid cache reuse {shift_min}: a chunk of >= 0 tokens (0: off)")
        self.budget = int(budget_bytes)
        self.min_tokens = min_tokens
        self.shift_min = int(shift_min)
        self._saved: list[SavedPrompt] = []
        self._clock = 0
        self._lock = threading.Lock()
        self._stats = PromptCacheStats()

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    def stats(self) -> PromptCacheStats:
        """A copy of the counters, with what is held now."""
        with self._lock:
            s = PromptCacheStats(**vars(self._stats))
            s.bytes, s.entries = sum(e.nbytes for e in self._saved), len(self._saved)
            return s

    def best(self, model: str, context: Sequence[int]) -> tuple[SavedPrompt | None, int]:
        """The saved state of ``model`` sharing the longest prefix with ``context``
        (the most recent of equals), and that length; (None, 0) if none is saved."""
        with self._lock:
            found, length = None, 0
            for entry in reversed(self._saved):  # most recently used first
                if entry.model == model:
                    n = common_prefix_length(entry.tokens, context)
                    if n > length:
                        found, length = entry, n
            return found, length

    def looked_up(self, entry: SavedPrompt | None, restored_tokens: int = 0) -> None:
        """Count a lookup: ``entry`` was restored (a hit), or None was (a miss)."""
        with self._lock:
            if entry is None:
                self._stats.misses += 1
                return
            self._stats.hits += 1
            self._stats.restored_tokens += restored_tokens
            self._clock += 1
            entry.used = self._clock

    def holds(self, model: str, tokens: Sequence[int]) -> bool:
        """Whether a saved state of ``model`` already holds ``tokens`` (or more)."""
        with self._lock:
            return any(e.model == model and len(e.tokens) >= len(tokens)
                       and common_prefix_length(e.tokens, tokens) == len(tokens) for e in self._saved)

    def save(self, model: str, tokens: Sequence[int], state: object, nbytes: int) -> bool:
        """Keep ``state`` (holding ``tokens`` of ``model``), dropping the saved states
        it extends and then the least recently used until it fits; False if it is
        larger than the whole budget (it is not kept)."""
        with self._lock:
            if nbytes > self.budget:
                return False
            tokens = list(tokens)
            # A state this one extends is superseded: the same conversation, shorter.
            self._saved = [e for e in self._saved if not (
                e.model == model and len(e.tokens) <= len(tokens)
                and common_prefix_length(e.tokens, tokens) == len(e.tokens))]
            held = sum(e.nbytes for e in self._saved)
            self._saved.sort(key=lambda e: e.used)
            while self._saved and held + nbytes > self.budget:
                held -= self._saved.pop(0).nbytes
                self._stats.evictions += 1
            self._clock += 1
            self._saved.append(SavedPrompt(model, tokens, state, int(nbytes), self._clock))
            self._stats.saves += 1
            return True

    def clear(self) -> None:
        """Drop every saved state (their memory goes with them)."""
        with self._lock:
            self._saved.clear()


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    a, b = _as_list(a), _as_list(b)
    n = min(len(a), len(b))
    # Fast path: the usual case is that one list extends the other (slices of lists
    # compare at C speed; this runs a few times per round over the whole context).
    if (a if len(a) == n else a[:n]) == (b if len(b) == n else b[:n]):
        return n
    lo, hi = 0, n  # invariant: a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _as_list(tokens: Sequence[int]) -> list[int]:
    return tokens if isinstance(tokens, list) else list(tokens)
