"""What every backend provides: one model, its tokenizer and its KV cache.

A backend knows nothing of drafting. The engine and the drafters talk to it
through :class:`Backend` and keep track of its cache through
:class:`edgespec.core.cache.CachedModel`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable

import numpy as np


@dataclass
class VocabInfo:
    """The facts about a vocabulary that decide whether two models can pair."""

    size: int
    kind: str  # e.g. "bpe", "spm", "toy"
    bos_token_id: int | None
    eos_token_ids: frozenset[int]
    special_token_ids: dict[str, int] = field(default_factory=dict)


@runtime_checkable
class Backend(Protocol):
    """One loaded model.

    ``forward(tokens)`` appends ``tokens`` to the KV cache and returns the
    logits ``[len(tokens), V]`` for exactly those positions (row i predicts the
    token after ``tokens[i]``); with ``last_only=True`` only the last row,
    ``[1, V]`` (a prefill). ``rewind(n_past)`` drops everything after the
    first ``n_past`` cached tokens.

    ``verify(logits, draft_token_ids, draft_probs, params, rng, *, draft_scales,
    position, confidence, scratch)`` decides a round from the rows of a pass, and
    returns what :func:`edgespec.core.acceptance.verify_round` returns: a backend whose
    logits come to the host verifies with that function
    (:class:`edgespec.core.acceptance.HostVerify`). One whose logits can stay on its
    device (MLX) says so with ``device_logits = True``: its ``forward(...,
    lazy=True)`` returns them unevaluated, and its ``verify`` decides the round
    there. The engine asks for the pass through
    :meth:`edgespec.core.cache.CachedModel.verify_pass` and verifies with ``verify``,
    whichever the backend.
    """

    name: str
    vocab: VocabInfo
    n_ctx: int
    # What it runs and how (:class:`BackendFacts` has the defaults of a backend that says
    # nothing else): the file (or folder) it loaded, its threads, its layers on a GPU or
    # on rpc-server endpoints; the bytes of weights it holds; with exact kernels
    # (``bit_exact``) the longest pass that rounds as one-token steps (``exact_chunk``),
    # else why not (``not_exact``); whether its logits can stay on its device.
    path: str | None
    n_threads: int | None
    n_gpu_layers: int
    rpc: tuple[str, ...]
    memory_bytes: int
    bit_exact: bool
    exact_chunk: int
    not_exact: str | None
    # With exact kernels: whether a prompt pass leaves the K/V one-token steps leave (then
    # a reply's tokens may be reused for the next prompt; else only whole prompt passes).
    exact_prefill: bool
    device_logits: bool

    @property
    def n_past(self) -> int: ...

    def forward(self, tokens: Sequence[int], *, last_only: bool = False) -> np.ndarray: ...

    def rewind(self, n_past: int) -> None: ...

    def tokenize(self, text: str, *, add_bos: bool = True, special: bool = True) -> list[int]: ...

    def token_bytes(self, token_id: int) -> bytes: ...

    def token_text(self, token_id: int) -> str: ...  # the vocabulary's own spelling

    def apply_chat_template(self, messages: list[dict], *, add_generation_prompt: bool = True,
                            max_chars: int | None = None, tools: list[dict] | None = None) -> str: ...

    def verify(self, logits, draft_token_ids: Sequence[int], draft_probs, params, rng, *,
               draft_scales=None, position: int = 0, confidence: bool = True,
               scratch=None) -> tuple: ...

    def chat_template(self) -> str | None: ...  # its Jinja chat template (None: none)

    def use_chat_template(self, template: str) -> None: ...  # render chats with this Jinja instead

    # The KV cache's contents as a copy in host memory (anything with ``nbytes``), or
    # None where the backend cannot save it; ``load_state`` puts such a copy back (the
    # cache then holds what it held when saved), or the bytes ``state_bytes`` made of one
    # (read back from a file), or raises EdgespecError.
    def save_state(self) -> object | None: ...

    def load_state(self, state: object) -> None: ...

    # What a saved state's bytes depend on, as one string: the model's identity (its
    # bytes, not its path) first, then "|" and each setting (context size, kernels, KV
    # cache type, the library's version). None: its states never leave this process.
    state_key: str | None

    def state_bytes(self, state: object) -> np.ndarray: ...  # a save_state copy as uint8 bytes

    # Move the cached positions [start, end) by ``delta`` (< 0) into the gap before them,
    # dropping what held it (llama.cpp's KV shift: its keys are rotated anew); False,
    # and nothing changed, where the model's positions or memory do not allow it.
    def shift(self, start: int, end: int, delta: int) -> bool: ...

    def close(self) -> None: ...


def logits_on_device(backend: Backend, *, shaping=None, logprobs: int | None = None) -> bool:
    """Whether a pass's logits stay on the backend's device, to be sampled and verified
    there (only token ids then come to the host): where the backend can keep them
    (``device_logits``: MLX) and nothing reads them on the host (a request's
    ``shaping``, i.e. bias, penalties or a grammar, or its ``logprobs``). The one
    place this is decided: the caches' passes, the engine's rounds and a draft
    model's drafting all ask it, and a backend's ``verify`` decides where the logits
    it is handed are."""
    return bool(backend.device_logits) and shaping is None and logprobs is None


class BackendFacts:
    """The facts :class:`Backend` declares, as a backend that says nothing else has
    them: no file, the default threads, nothing offloaded, fast kernels, logits on the
    host, no chat template of its own. A backend overrides what differs."""

    path: str | None = None
    n_threads: int | None = None
    n_gpu_layers: int = 0
    rpc: tuple[str, ...] = ()
    memory_bytes: int = 0
    bit_exact: bool = False
    exact_chunk: int = 0
    not_exact: str | None = "no batch-invariant kernels on this backend"
    exact_prefill: bool = False
    device_logits: bool = False

    def chat_template(self) -> str | None:
        """The model's Jinja chat template (None: it has none; ChatML is used)."""
        return None

    def use_chat_template(self, template: str) -> None:
        from ..errors import EdgespecError
        raise EdgespecError(f"{self.name} renders its own prompts: it takes no chat template")

    state_key: str | None = None

    def save_state(self) -> object | None:
        """No saved states: its prompts are not kept in a prompt cache."""
        return None

    def state_bytes(self, state: object):
        from ..errors import EdgespecError
        raise EdgespecError(f"{self.name} cannot write a saved state to a file")

    def load_state(self, state: object) -> None:
        from ..errors import EdgespecError
        raise EdgespecError(f"{self.name} cannot restore a saved state")

    def shift(self, start: int, end: int, delta: int) -> bool:
        """No KV shift: a chunk after a divergence is evaluated again."""
        return False


class TokenizerMethods:
    """The tokenizer half of :class:`Backend`, for backends that hold a ``tokenizer``
    object (a GGUF tokenizer through llama.cpp, or a Hugging Face one)."""

    tokenizer: object

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.token_text(token_id)

    def tokenize(self, text: str, *, add_bos: bool = True, special: bool = True) -> list[int]:
        return self.tokenizer.tokenize(text, add_bos=add_bos, special=special)

    def token_bytes(self, token_id: int) -> bytes:
        return self.tokenizer.token_bytes(token_id)

    def apply_chat_template(self, messages: list[dict], *, add_generation_prompt: bool = True,
                            max_chars: int | None = None, tools: list[dict] | None = None) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                  max_chars=max_chars, **({"tools": tools} if tools else {}))

    def chat_template(self) -> str | None:
        """The model's Jinja chat template (None: it has none; ChatML is used)."""
        return self.tokenizer.chat_template()

    def use_chat_template(self, template: str) -> None:
        """Render chats with ``template`` (Jinja) instead of the model's own (--chat-template)."""
        self.tokenizer.use_chat_template(template)


def check_token_ids(tokens: Sequence[int], vocab_size: int) -> None:
    """Refuse ids outside ``0 .. vocab_size - 1`` before a model reads its embedding
    table with them (out of range, MLX reads garbage or crashes the process)."""
    from ..errors import EdgespecError
    for token in tokens:
        if not 0 <= int(token) < vocab_size:
            raise EdgespecError(f"token id {int(token)} is outside the vocabulary "
                                f"(0 .. {vocab_size - 1}): pass ids the model's tokenizer made")


def closed_error(name: str):
    """What a backend raises when used after ``close()`` (instead of reading freed memory)."""
    from ..errors import EdgespecError
    return EdgespecError(f"{name} is closed: load the model again to use it")


def check_forward(n_past: int, num_tokens: int, n_ctx: int) -> None:
    """The checks every backend's ``forward`` makes before it evaluates anything."""
    from ..errors import EdgespecError
    if num_tokens == 0:
        raise ValueError("forward needs at least one token")
    if n_past + num_tokens > n_ctx:
        raise EdgespecError(
            f"the context is full ({n_ctx} tokens): start a new conversation or raise --ctx")
