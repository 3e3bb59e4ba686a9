"""A model's KV cache as a list of token ids, kept in step with the backend."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .backend import Backend, logits_on_device


class CachedModel:
    """A backend together with the token ids its KV cache holds.

    Keeps ``tokens`` and the backend's cache in step, so a caller can ask for
    "the cache should hold this prefix" (:meth:`sync`) and only the missing
    tokens are evaluated. If a forward fails or is interrupted (Ctrl-C), the
    cache is rewound to what it held before, so it never holds unknown tokens.
    """

    def __init__(self, backend: Backend):
        self.backend = backend
        self.tokens: list[int] = []
        backend.rewind(0)

    def forward(self, token_ids: Sequence[int], *, last_only: bool = False,
                on_device: bool = False) -> np.ndarray:
        """Evaluate ``token_ids`` after the cached tokens; return their logits.

        ``on_device`` (for a backend with ``device_logits``, i.e. MLX): the logits
        as a lazy device array, not brought to the host.
        """
        before = len(self.tokens)
        try:
            logits = self.backend.forward(token_ids, last_only=last_only, lazy=True) if on_device \
                else self.backend.forward(token_ids, last_only=last_only)
        except BaseException:
            self.backend.rewind(before)
            raise
        self.tokens.extend(int(t) for t in token_ids)
        return logits

    def on_device(self, *, shaping=None, logprobs: int | None = None) -> bool:
        """Whether this model's logits stay on its device (MLX), for a request with
        these ``shaping`` and ``logprobs`` (:func:`~edgespec.core.backend.logits_on_device`)."""
        return logits_on_device(self.backend, shaping=shaping, logprobs=logprobs)

    def verify_pass(self, token_ids: Sequence[int], *, shaping=None, logprobs: int | None = None):
        """Evaluate ``token_ids`` (a pending token and drafts) for the backend's own
        ``verify``: their logits, left on the device where :meth:`on_device` says so
        (for a request with these ``shaping`` and ``logprobs``), else on the host."""
        return self.forward(token_ids, on_device=self.on_device(shaping=shaping, logprobs=logprobs))

    def rewind(self, n_past: int) -> None:
        """Keep only the first ``n_past`` cached tokens.

        The backend is always asked (it is cheap): after an interruption it may
        hold more than ``tokens`` knows of.
        """
        self.backend.rewind(n_past)
        del self.tokens[n_past:]

    def record(self, token_ids: Sequence[int]) -> None:
        """The backend evaluated ``token_ids`` lazily, outside :meth:`forward`
        (a device draft loop); now that their ids are known, note them."""
        self.tokens.extend(int(t) for t in token_ids)

    def sync(self, context: Sequence[int], *, need_logits: bool,
             on_device: bool = False) -> tuple[np.ndarray | None, int]:
        """Make the cache hold exactly ``context``, evaluating only what is missing.

        With ``need_logits`` the last token of ``context`` is (re-)evaluated if
        necessary so that its logits ``[V]`` can be returned. Returns
        ``(logits or None, number of tokens evaluated)``.
        """
        common = common_prefix_length(self.tokens, context)
        if need_logits:
            common = min(common, len(context) - 1)
        self.rewind(common)
        missing = context[common:]
        if not missing:
            return None, 0
        logits = self.forward(missing, last_only=True, on_device=on_device)
        return logits[-1], len(missing)


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
