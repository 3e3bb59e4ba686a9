"""A tiny numpy language model, for the statistics tests only.

Its next-token logits depend on the last two tokens of the context through a
random table, so drafts, caches and rewinds behave as with a real model while
a generation costs microseconds: tens of thousands of samples fit in a test.
Token i is the letter ``chr(ord("a") + i)``.

With a :class:`SimClock`, each pass also advances that clock by what a pass
of its size would cost on a real machine (``step_seconds`` for one token,
``token_seconds`` for each further token), so tests of how auto mode reacts
to costs are deterministic: give the engine the same clock.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..core.acceptance import HostVerify
from ..core.backend import BackendFacts, VocabInfo


class SimClock:
    """Simulated seconds: a callable clock that toy backends advance."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class ToyBackend(BackendFacts, HostVerify):
    """A context-dependent random LM over ``vocab_size`` letters."""

    def __init__(self, table: np.ndarray, *, eos_token_id: int | None = None, name: str = "toy",
                 clock: SimClock | None = None, step_seconds: float = 0.0,
                 token_seconds: float = 0.0):
        vocab_size = table.shape[-1]
        if table.shape != (vocab_size, vocab_size, vocab_size):
            raise ValueError("table must be [V, V, V]: logits indexed by the last two tokens")
        self.table = table.astype(np.float32)
        self.name = name
        eos = frozenset() if eos_token_id is None else frozenset({eos_token_id})
        self.vocab = VocabInfo(size=vocab_size, kind="toy", bos_token_id=None, eos_token_ids=eos)
        self.n_ctx = 1 << 20
        self._cache: list[int] = []
        self.forward_calls = 0  # tests count target passes with this
        self.clock, self.step_seconds, self.token_seconds = clock, step_seconds, token_seconds

    @classmethod
    def random(cls, vocab_size: int, *, seed: int, scale: float = 2.0, **kwargs) -> "ToyBackend":
        """A random model; larger ``scale`` makes its distributions peakier."""
        rng = np.random.default_rng(seed)
        return cls(rng.normal(0.0, scale, (vocab_size,) * 3), **kwargs)

    def perturbed(self, *, noise: float, seed: int, name: str = "toy-draft",
                  **timing) -> "ToyBackend":
        """A drafter-like model: this one's logits plus Gaussian noise (``timing``:
        ``clock``, ``step_seconds``, ``token_seconds`` as for the constructor)."""
        rng = np.random.default_rng(seed)
        table = self.table + rng.normal(0.0, noise, self.table.shape)
        eos = next(iter(self.vocab.eos_token_ids), None)
        return ToyBackend(table, eos_token_id=eos, name=name, **timing)

    @property
    def n_past(self) -> int:
        return len(self._cache)

    def _logits_after(self, position: int) -> np.ndarray:
        prev = self._cache[position - 1] if position >= 1 else 0
        last = self._cache[position]
        return self.table[prev, last]

    def forward(self, tokens: Sequence[int], *, last_only: bool = False) -> np.ndarray:
        if not tokens:
            raise ValueError("forward needs at least one token")
        if len(self._cache) + len(tokens) > self.n_ctx:
            raise ValueError("context full")
        self.forward_calls += 1
        if self.clock is not None:
            self.clock.advance(self.step_seconds + self.token_seconds * (len(tokens) - 1))
        start = len(self._cache)
        self._cache.extend(int(t) for t in tokens)
        positions = range(len(self._cache) - 1, len(self._cache)) if last_only else \
            range(start, len(self._cache))
        return np.stack([self._logits_after(i) for i in positions])

    def rewind(self, n_past: int) -> None:
        del self._cache[n_past:]

    def tokenize(self, text: str, *, add_bos: bool = True, special: bool = True) -> list[int]:
        ids = [ord(ch) - ord("a") for ch in text]
        if any(not 0 <= i < self.vocab.size for i in ids):
            raise ValueError(f"toy vocabulary has only the letters a..{chr(ord('a') + self.vocab.size - 1)}")
        return ids

    def token_bytes(self, token_id: int) -> bytes:
        return chr(ord("a") + token_id).encode()

    def token_text(self, token_id: int) -> str:
        return chr(ord("a") + token_id)

    def apply_chat_template(self, messages: list[dict], *, add_generation_prompt: bool = True,
                            max_chars: int | None = None) -> str:
        return "".join(m["content"] for m in messages)

    def close(self) -> None:
        self._cache.clear()
