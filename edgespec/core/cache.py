"""A model's KV cache as a list of token ids, kept in step with the backend."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..errors import EdgespecError
from .backend import Backend, logits_on_device
from .prompt_cache import PromptCache, common_prefix_length
from .prompt_disk import DiskEntry, log

__all__ = ["CachedModel", "PromptProgress", "common_prefix_length", "PREFILL_CHUNK"]

# Prompt tokens evaluated in one pass (llama.cpp's default batch), in passes that start
# at multiples of it: then the same prompt is evaluated in the same passes whatever
# was cached before it, which exact kernels need of a restored state.
PREFILL_CHUNK = 512


@dataclass(frozen=True)
class PromptProgress:
    """How far the processing of a prompt has come (llama-server's ``prompt_progress``):
    of its ``total`` tokens, ``cache`` were reused or restored and ``processed`` are in
    the model's cache now (cached ones included), ``seconds`` after it began. The
    processing's own share is ``(processed - cache) / (total - cache)``."""

    total: int
    cache: int
    processed: int
    seconds: float

    def seconds_left(self) -> float | None:
        """The time left at the rate so far (None before the first pass has ended)."""
        done = self.processed - self.cache
        if done <= 0 or self.seconds <= 0:
            return None
        return (self.total - self.processed) * self.seconds / done


class CachedModel:
    """A backend together with the token ids its KV cache holds.

    Keeps ``tokens`` and the backend's cache in step, so a caller can ask for
    "the cache should hold this prefix" (:meth:`sync`) and only the missing
    tokens are evaluated. If a forward fails or is interrupted (Ctrl-C), the
    cache is rewound to what it held before, so it never holds unknown tokens.

    ``aligned`` counts the first tokens whose K/V came from whole prefill passes of
    :data:`PREFILL_CHUNK` tokens starting at its multiples: what a cold prefill of
    the same tokens computes bit for bit. With exact kernels on a backend whose prompt
    passes round otherwise than one-token steps (``exact_prefill`` false: repacked
    weights), only those are reused for a new prompt or restored from a saved state (a
    reply's tokens, decoded a pass at a time, would differ from a prompt's batch), so a
    prompt's output never depends on what was cached: the cold run's, token for token.
    """

    def __init__(self, backend: Backend, prompt_cache: PromptCache | None = None):
        self.backend = backend
        self.tokens: list[int] = []
        self.aligned = 0
        # Where the conversations this cache drops are kept for later (None: nowhere).
        self.prompt_cache = prompt_cache
        # A saved state is restored only into a cache of the same model, context, kernels
        # and KV type: what its key names (a backend without one: this process only).
        self.key = backend.state_key or f"{backend.name}|{backend.path}|{backend.n_ctx}|{backend.bit_exact}"
        self.restores = 0  # states restored so far (what was computed after the old one is void)
        backend.rewind(0)

    @property
    def reusable(self) -> int:
        """How many cached tokens a new prompt may keep: all of them, or (exact kernels
        whose prompt passes round otherwise than one-token steps) the :attr:`aligned` ones."""
        return min(self.aligned, len(self.tokens)) if self._passes_only else len(self.tokens)

    @property
    def _passes_only(self) -> bool:
        """Whether only K/V from whole prompt passes may be reused (exact kernels whose
        prompt passes round otherwise than one-token steps)."""
        return self.backend.bit_exact and not self.backend.exact_prefill

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
        if before == self.aligned:  # whole prefill passes from an aligned start
            self.aligned += len(token_ids) // PREFILL_CHUNK * PREFILL_CHUNK
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
        self.aligned = min(self.aligned, n_past // PREFILL_CHUNK * PREFILL_CHUNK)

    def reuse(self, context: Sequence[int], *, cached: bool = True) -> tuple[int, int]:
        """For a new prompt: keep the longest prefix of ``context`` there is without
        evaluating anything (with exact kernels, of what :attr:`reusable` allows), and
        rewind to it. Returns ``(tokens kept, of which
        restored from the prompt cache)``. ``cached=False``: keep nothing (a request's
        ``cache_prompt: false``).

        With a :attr:`prompt_cache`, a cache about to drop a long conversation saves
        it first, and a saved state that shares a longer prefix of ``context`` than
        the cache does is restored. Short differences (a turn's template tokens, a
        round's rejected drafts) cost no lookup.
        """
        if not cached:
            self.rewind(0)
            return 0, 0
        common = self._whole(min(common_prefix_length(self.tokens, context), self.reusable))
        saved, restored = self.prompt_cache, 0
        if saved is not None and saved.enabled and (
                len(context) - common >= saved.min_tokens or len(self.tokens) - common >= saved.min_tokens):
            if len(self.tokens) - common >= saved.min_tokens:
                self.keep()  # (before the state is replaced or trimmed)
            entry, matched = saved.best(self.key, context)
            matched = self._whole(matched)
            # A file is read (and checked) first: one that fails leaves the cache as it is.
            state = None if entry is None or matched < common + saved.min_tokens else \
                saved.read(entry) if isinstance(entry, DiskEntry) else entry.state
            if state is not None:
                if self._restore(entry, state):
                    common = restored = matched
                    saved.looked_up(entry, matched)
                else:
                    common = 0
                    saved.looked_up(None)
            elif len(context) - common >= saved.min_tokens:
                saved.looked_up(None)
        if saved is not None and saved.shift_min and not self.backend.bit_exact:
            common = self._shift_chunks(context, common, saved.shift_min)
        self.rewind(common)
        return common, restored

    def prefill(self, prompt: Sequence[int], *, cached: bool = True, cancel=None, progress=None,
                clock=time.perf_counter) -> tuple[int, int] | None:
        """Make the cache hold ``prompt`` (a generation's prompt but its last token):
        reuse what there is (:meth:`reuse`; ``cached=False``: nothing), then evaluate the
        rest in passes that end at multiples of :data:`PREFILL_CHUNK` (a prompt is
        evaluated in the same passes whatever was cached), looking at ``cancel`` (an
        event) between them and telling ``progress`` how far it has come
        (a :class:`PromptProgress` over the whole prompt, the
        last token too: once with what was cached, after each pass, and at the end).
        Returns ``(tokens evaluated, tokens restored from saved prompts)``, or None if
        cancelled."""
        total = len(prompt) + 1
        done, restored = self.reuse(prompt, cached=cached)
        start, kept, evaluated = clock(), done, 0  # (the rate is the evaluation's, a restore's time apart)
        while True:
            if progress is not None:
                progress(PromptProgress(total, kept, done, clock() - start))
            if done >= len(prompt):
                break
            if cancel is not None and cancel.is_set():
                return None
            done = min((done // PREFILL_CHUNK + 1) * PREFILL_CHUNK, len(prompt))
            evaluated += self.sync(prompt[:done], need_logits=False)[1]
        if progress is not None:  # (the last token goes in with the first round: as far as a wait goes, done)
            progress(PromptProgress(total, kept, total, clock() - start))
        return evaluated, restored

    def _whole(self, n: int) -> int:
        """``n`` kept tokens, with exact kernels cut to whole prefill passes (the next pass
        must start where a cold prefill's does)."""
        return n // PREFILL_CHUNK * PREFILL_CHUNK if self._passes_only else n

    def _shift_chunks(self, context: Sequence[int], common: int, min_chunk: int) -> int:
        """llama-server's ``--cache-reuse``: past the common prefix, cached chunks of at
        least ``min_chunk`` tokens that come next in ``context`` (what lay between them
        was dropped, as when a client trims its history) go into place by KV shift
        instead of being evaluated again. Not exact: their K/V were computed after the
        dropped tokens (docs/exactness.md), so it is off unless asked for, and never
        with exact kernels. Returns how many tokens of ``context`` the cache now holds."""
        cache, head_c, head_p = self.tokens, common, common
        while head_c < len(cache) and head_p < len(context):
            n = 0
            while head_c + n < len(cache) and head_p + n < len(context) \
                    and cache[head_c + n] == context[head_p + n]:
                n += 1
            if n < min_chunk:
                head_c += 1
            elif self.backend.shift(head_c, head_c + n, head_p - head_c):
                head_c, head_p = head_c + n, head_p + n
            else:
                break
        if head_p > common:
            self.tokens = list(context[:head_p])  # (the rewind that follows drops the rest)
            self.aligned = min(self.aligned, common)
            self.restores += 1  # (what a drafter computed after the old contents is void)
        return head_p

    def keep(self) -> bool:
        """Save what the cache holds to the prompt cache (unless a saved state already
        holds it, or it is too short to be worth it); whether it was saved."""
        saved, usable = self.prompt_cache, self.reusable
        if saved is None or not saved.enabled or usable < saved.min_tokens \
                or self.backend.n_past != len(self.tokens) or saved.holds(self.key, self.tokens, usable):
            return False
        state = self.backend.save_state()
        dump = self.backend.state_bytes if self.backend.state_key else None
        return state is not None and saved.save(self.key, self.tokens, state, state.nbytes,
                                                usable=usable, dump=dump)

    def _restore(self, entry, state) -> bool:
        """Put ``state`` (``entry``'s: from RAM, or read from the folder and checked) in
        the backend; False (the cache emptied) if the backend refuses it or then holds
        another number of tokens than the entry says."""
        key = entry.key if isinstance(entry, DiskEntry) else entry.model
        if key != self.key:
            raise EdgespecError(f"a saved state of {key.split('|')[0]} cannot be restored "
                                f"into {self.backend.name}: it is another model or context size")
        try:
            self.backend.load_state(state)
            if self.backend.n_past != len(entry.tokens):
                raise EdgespecError(f"it holds {self.backend.n_past} positions, not {len(entry.tokens)}")
        except EdgespecError as exc:
            if isinstance(entry, DiskEntry):
                log.warning("%s refused the saved prompt state %s (%s): removed; the prompt is "
                            "evaluated instead", self.backend.name, entry.path.name, exc)
                self.prompt_cache.forget(entry)
            self.rewind(0)
            return False
        except BaseException:  # interrupted mid-copy: whatever is there is unknown
            self.rewind(0)
            raise
        self.tokens = list(entry.tokens)
        self.aligned = entry.usable
        self.restores += 1
        return True

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
