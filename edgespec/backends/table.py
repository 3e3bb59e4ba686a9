"""A backend whose forward pass costs (almost) nothing: logits from a table.

For measuring the engine's own host work per token (``scripts/bench_overhead.py``)
at a real vocabulary size, with nothing else on the clock. Row i of the table
is the logits after position i (modulo the table's length), whatever the
tokens: a context-free LM whose output repeats with the table's period, so
prompt lookup finds something to copy. :meth:`TableBackend.perturbed` gives a
drafter that agrees with it as often as its noise allows.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..core.acceptance import HostVerify
from ..core.backend import BackendFacts, VocabInfo, check_forward


class TableBackend(BackendFacts, HostVerify):
    """Logits ``table[position % len(table)]``: rows handed over as views, no copy."""

    def __init__(self, table: np.ndarray, *, name: str = "table", eos_token_id: int | None = None,
                 n_ctx: int = 1 << 16):
        if table.ndim != 2:
            raise ValueError("table must be [rows, V]")
        self.table = np.ascontiguousarray(table, dtype=np.float32)
        self.name = name
        eos = frozenset() if eos_token_id is None else frozenset({eos_token_id})
        self.vocab = VocabInfo(size=table.shape[1], kind="table", bos_token_id=None,
                               eos_token_ids=eos)
        self.n_ctx = n_ctx
        self._n_past = 0

    @classmethod
    def random(cls, vocab_size: int, *, rows: int = 64, spread: float = 2.0, seed: int = 0,
               **kwargs) -> "TableBackend":
        """Random rows shaped like a language model's: Gaussian logits (``spread``) with
        one favoured token per row, favoured by a margin drawn so that the top
        probability ranges from a coin toss to near certainty, mostly high."""
        rng = np.random.default_rng(seed)
        table = rng.standard_normal((rows, vocab_size), dtype=np.float32) * spread
        # log-sum-exp of the other logits is about log V + spread²/2: a margin above it
        # of -2..8 gives top probabilities from ~0.1 to ~0.9997.
        margin = np.log(vocab_size) + spread ** 2 / 2 + rng.uniform(-2.0, 8.0, rows)
        table[np.arange(rows), rng.integers(0, vocab_size, rows)] += margin.astype(np.float32)
        return cls(table, **kwargs)

    def perturbed(self, *, noise: float, seed: int, name: str = "table-draft") -> "TableBackend":
        """A drafter: these logits plus Gaussian noise of standard deviation ``noise``."""
        rng = np.random.default_rng(seed)
        table = self.table + rng.standard_normal(self.table.shape, dtype=np.float32) * noise
        return TableBackend(table, name=name, n_ctx=self.n_ctx,
                            eos_token_id=next(iter(self.vocab.eos_token_ids), None))

    @property
    def n_past(self) -> int:
        return self._n_past

    def forward(self, tokens: Sequence[int], *, last_only: bool = False) -> np.ndarray:
        check_forward(self._n_past, len(tokens), self.n_ctx)
        start, self._n_past = self._n_past, self._n_past + len(tokens)
        first = self._n_past - 1 if last_only else start
        rows = len(self.table)
        if first // rows == (self._n_past - 1) // rows:  # one slice of the table: a view
            return self.table[first % rows:(self._n_past - 1) % rows + 1]
        return self.table[np.arange(first, self._n_past) % rows]

    def rewind(self, n_past: int) -> None:
        self._n_past = min(self._n_past, n_past)

    def tokenize(self, text: str, *, add_bos: bool = True, special: bool = True) -> list[int]:
        return [b for b in text.encode()]  # bytes as ids: enough for a benchmark's prompt

    def token_bytes(self, token_id: int) -> bytes:
        return bytes([token_id]) if token_id < 256 else b"?"

    def token_text(self, token_id: int) -> str:
        return self.token_bytes(token_id).decode("latin-1")

    def apply_chat_template(self, messages: list[dict], *, add_generation_prompt: bool = True,
                            max_chars: int | None = None) -> str:
        return "".join(m["content"] for m in messages)

    def close(self) -> None:
        self._n_past = 0
