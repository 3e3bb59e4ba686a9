"""The MLX backend, on mlx-lm's model classes and its trimmable KV cache.

Metal runs it on Apple Silicon; on Linux MLX uses its CPU backend. Models
come from an mlx-lm folder, a Hugging Face repo id (a local cache hit needs
no network), or a GGUF file converted by :mod:`edgespec.backends.gguf_mlx` (whose
tokenizer and chat template are read through llama.cpp, so both backends
tokenize a GGUF model identically).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..core.acceptance import verify_round
from ..errors import EdgespecError
from ..core.backend import BackendFacts, TokenizerMethods, VocabInfo, check_forward, check_token_ids, closed_error
from .kernels import EXACT, MLX_CHUNKS, kernel_mode, prefill_invariant, probe

try:
    import mlx.core as mx
    from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise EdgespecError(
        "the MLX backend needs mlx and mlx-lm: pip install mlx mlx-lm on macOS, "
        "pip install 'mlx[cpu]' mlx-lm on Linux") from exc

_PREFILL_CHUNK = 512
_UINT = {1: mx.uint8, 2: mx.uint16, 4: mx.uint32, 8: mx.uint64}


@dataclass
class MlxState:
    """A saved MLX cache: each layer's (keys, values) over ``n_past`` positions."""

    arrays: list
    n_past: int
    nbytes: int

    def to_bytes(self) -> np.ndarray:
        """The state as bytes for a file: a JSON header (positions, each array's dtype
        and shape), its length before it (8 bytes), then each array's raw bytes."""
        flat = [a for pair in self.arrays for a in pair]
        header = json.dumps({"n_past": self.n_past,
                             "arrays": [[str(a.dtype).split(".")[-1], list(a.shape)] for a in flat]}).encode()
        parts = [np.frombuffer(len(header).to_bytes(8, "little") + header, dtype=np.uint8)]
        for a in flat:  # (viewed as unsigned integers: numpy has no bfloat16)
            parts.append(np.array(a.view(_UINT[a.dtype.size])).view(np.uint8).reshape(-1))
        return np.concatenate(parts)

    @classmethod
    def from_bytes(cls, data: np.ndarray) -> "MlxState":
        """What :meth:`to_bytes` wrote (ValueError if it is not that)."""
        raw = memoryview(np.ascontiguousarray(data, dtype=np.uint8))
        length = int.from_bytes(raw[:8], "little")
        header = json.loads(bytes(raw[8:8 + length]))
        offset, flat = 8 + length, []
        for dtype_name, shape in header["arrays"]:
            dtype = getattr(mx, dtype_name)
            size = int(np.prod(shape)) * dtype.size
            if offset + size > len(raw):
                raise ValueError("the saved MLX state is shorter than its header says")
            ints = np.frombuffer(raw[offset:offset + size], dtype=f"<u{dtype.size}").reshape(shape)
            flat.append(mx.array(ints).view(dtype))
            offset += size
        arrays = list(zip(flat[0::2], flat[1::2]))
        return cls(arrays, int(header["n_past"]), sum(k.nbytes + v.nbytes for k, v in arrays))


class MlxBackend(TokenizerMethods, BackendFacts):
    """An mlx-lm model behind the :class:`~edgespec.core.backend.Backend` protocol."""

    def __init__(self, model, tokenizer, *, name: str, n_ctx: int = 4096, kernels: str | None = None,
                 path: Path | None = None):
        self.model = model
        self.path = path  # the mlx-lm folder it came from (None: built in memory)
        self.tokenizer = tokenizer
        self.name = name
        self.vocab = tokenizer.vocab
        self.n_ctx = n_ctx
        self.cache = make_prompt_cache(model)
        # A rotating (sliding-window) cache is trimmable only until the window fills.
        if not can_trim_prompt_cache(self.cache) or any(
                type(c).__name__ == "RotatingKVCache" for c in self.cache):
            kinds = sorted({type(c).__name__ for c in self.cache
                            if not c.is_trimmable() or type(c).__name__ == "RotatingKVCache"})
            raise EdgespecError(
                f"{name}: speculative decoding requires a trimmable prompt cache (got "
                f"{', '.join(kinds)}): use a model with a plain KV cache, or --backend llama.cpp")
        self._n_past = 0
        # Exact kernels (backends/kernels.py): MLX has one set of kernels, so "exact" is a
        # probe of whether its passes round as one-token steps, and passes no longer than
        # the longest size that does.
        self.exact_chunk = 0
        if kernel_mode(kernels) == EXACT:
            self.exact_chunk, self.not_exact = probe(self, MLX_CHUNKS)
        else:
            self.not_exact = "fast kernels: whether a pass rounds as one-token steps is not checked"
        self.bit_exact = self.not_exact is None
        self.exact_prefill = self.bit_exact and prefill_invariant(self)
        if path is not None:
            from ..paths import model_identity
            self.state_key = "|".join([model_identity(path), f"mlx {mx.__version__}", f"ctx={n_ctx}",
                                       f"kernels={kernel_mode(kernels)}:{self.exact_chunk}:"
                                       f"{int(self.exact_prefill)}", f"device={mx.default_device()}"])

    @property
    def n_past(self) -> int:
        return self._n_past

    device_logits = True  # forward(lazy=True) leaves logits on the device, and verify() decides there

    def forward(self, tokens: Sequence[int] | mx.array, *, last_only: bool = False,
                lazy: bool = False) -> np.ndarray | mx.array:
        """Run ``tokens`` through the model; logits ``[n, V]`` (``[1, V]`` if ``last_only``).

        ``lazy``: return the logits as an unevaluated ``mx.array`` (``tokens`` may
        be one too, e.g. a token just sampled on the device); the next evaluation
        runs the pass. Otherwise evaluate now and return a numpy array.
        """
        if self.model is None:
            raise closed_error(self.name)
        if isinstance(tokens, mx.array):
            n, ids = tokens.size, tokens.astype(mx.uint32).reshape(1, -1)
        else:  # ids from outside: checked (ids sampled on the device are the model's own)
            check_token_ids(tokens, self.vocab.size)
            n, ids = len(tokens), mx.array(list(tokens), dtype=mx.uint32)[None]
        check_forward(self._n_past, n, self.n_ctx)
        start = 0
        try:
            # Long prompts go in chunks so the attention scores stay small.
            while n - start > _PREFILL_CHUNK:
                self.model(ids[:, start:start + _PREFILL_CHUNK], cache=self.cache)
                mx.eval([c.state for c in self.cache])
                start += _PREFILL_CHUNK
            if self.exact_chunk and not last_only and n > self.exact_chunk:
                # Exact kernels: a verify pass in pieces that round as one-token steps.
                c = self.exact_chunk
                logits = mx.concatenate([self.model(ids[:, i:i + c], cache=self.cache)
                                         for i in range(start, n, c)], axis=1)
            else:
                logits = self.model(ids[:, start:], cache=self.cache)  # [1, n, V]
            if last_only:
                logits = logits[:, -1:, :]
            logits = logits[0].astype(mx.float32)
            if not lazy:
                mx.eval(logits)
        except BaseException:
            self.rewind(self._n_past)  # whatever part of the batch reached the cache is dropped
            raise
        self._n_past += n
        return logits if lazy else np.array(logits, copy=False)

    def rewind(self, n_past: int) -> None:
        # The cache's own offset is the truth, also after an interrupted forward.
        if self.model is None:
            raise closed_error(self.name)
        extra = self.cache[0].offset - n_past
        if extra > 0 and trim_prompt_cache(self.cache, extra) != extra:
            raise EdgespecError(f"{self.name}: the KV cache could not be trimmed by {extra} tokens")
        self._n_past = min(self._n_past, n_past)

    def verify(self, logits: mx.array, draft_token_ids: Sequence[int], draft_probs, params, rng, *,
               draft_scales: np.ndarray | None = None, position: int = 0, confidence: bool = True,
               scratch=None):
        """The verdict on a round from rows of logits ``[n, V]`` and the target's top
        probability at each committed token, where the logits are
        (:func:`edgespec.core.backend.logits_on_device` decided that): left on the device
        by ``forward(lazy=True)``, in one synchronization
        (:func:`edgespec.backends.mlx_ops.verify_on_device`; the device always reports the
        top probabilities: they cost nothing there); on the host,
        :func:`edgespec.core.acceptance.verify_round`, whose arguments these are."""
        if isinstance(logits, np.ndarray):
            return verify_round(logits, draft_token_ids, draft_probs, params, rng, draft_scales=draft_scales,
                                confidence=confidence, scratch=scratch, position=position)
        from .mlx_ops import verify_on_device
        return verify_on_device(logits, draft_token_ids, draft_probs, params, rng, draft_scales=draft_scales,
                                position=position)

    def save_state(self) -> "MlxState | None":
        """Each layer's keys and values up to the cache's offset (MLX copies them on
        the next write to the cache, so the arrays kept here never change); None for
        caches other than mlx-lm's plain ``KVCache``."""
        if self.model is None:
            raise closed_error(self.name)
        if any(type(c).__name__ != "KVCache" for c in self.cache) or self._n_past == 0:
            return None
        arrays = [(c.keys[..., :c.offset, :], c.values[..., :c.offset, :]) for c in self.cache]
        mx.eval(arrays)
        return MlxState(arrays, self._n_past, sum(k.nbytes + v.nbytes for k, v in arrays))

    def state_bytes(self, state: "MlxState") -> np.ndarray:
        """A :meth:`save_state` copy as bytes for a file (:meth:`MlxState.to_bytes`)."""
        return state.to_bytes()

    def load_state(self, state: "MlxState | np.ndarray") -> None:
        """Replace the cache with a :meth:`save_state` copy (written into fresh caches
        through their own ``update_and_fetch``, so the saved arrays stay as they are)."""
        if self.model is None:
            raise closed_error(self.name)
        if isinstance(state, np.ndarray):  # read back from a file
            try:
                state = MlxState.from_bytes(state)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise EdgespecError(f"{self.name} refused a saved state ({exc})") from None
        if not isinstance(state, MlxState) or len(state.arrays) != len(self.cache):
            raise EdgespecError(f"{self.name} refused a saved state (another model)")
        cache = make_prompt_cache(self.model)
        for layer, (keys, values) in zip(cache, state.arrays):
            layer.update_and_fetch(keys, values)
        mx.eval([c.state for c in cache])
        self.cache, self._n_past = cache, state.n_past

    @property
    def memory_bytes(self) -> int:
        """Bytes of model weights (as MLX holds them, quantized or not)."""
        from mlx.utils import tree_flatten
        return sum(v.nbytes for _, v in tree_flatten(self.model.parameters())) if self.model else 0

    def close(self) -> None:
        self.model = None
        self.cache = []
        if hasattr(self.tokenizer, "close"):
            self.tokenizer.close()
        mx.clear_cache()


class HFTokenizer:
    """A Hugging Face tokenizer (from an mlx-lm folder) behind the tokenizer methods."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: Sequence[int]):
        self.hf = tokenizer
        self._byte_decoder = None
        backend = getattr(tokenizer, "backend_tokenizer", None)
        decoder = json.loads(backend.to_str()).get("decoder") if backend is not None else None
        if decoder and "ByteLevel" in json.dumps(decoder):
            self._byte_decoder = {c: b for b, c in _bytes_to_unicode().items()}
        kind = "bpe" if self._byte_decoder else "spm"
        add_bos = bool(getattr(tokenizer, "add_bos_token", False)) and tokenizer.bos_token_id is not None
        specials = {label: int(getattr(tokenizer, f"{label}_token_id"))
                    for label in ("bos", "eos", "pad")
                    if getattr(tokenizer, f"{label}_token_id", None) is not None}
        self.vocab = VocabInfo(size=vocab_size, kind=kind,
                               bos_token_id=tokenizer.bos_token_id if add_bos else None,
                               eos_token_ids=frozenset(int(t) for t in eos_token_ids),
                               special_token_ids=specials)
        self._special_ids = set(tokenizer.all_special_ids) | set(
            getattr(tokenizer, "added_tokens_decoder", {}) or {})

    def token_text(self, token_id: int) -> str:
        return self.hf.convert_ids_to_tokens(int(token_id)) or ""

    def tokenize(self, text: str, *, add_bos: bool = True, special: bool = True) -> list[int]:
        ids = self.hf.encode(text, add_special_tokens=False, split_special_tokens=not special)
        bos = self.vocab.bos_token_id
        if add_bos and bos is not None and (not ids or ids[0] != bos):
            ids.insert(0, bos)
        return ids

    def token_bytes(self, token_id: int) -> bytes:
        piece = self.token_text(token_id)
        if token_id in self._special_ids:
            return piece.encode()
        match = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", piece)
        if match:
            return bytes([int(match.group(1), 16)])
        if self._byte_decoder is not None and all(c in self._byte_decoder for c in piece):
            return bytes(self._byte_decoder[c] for c in piece)
        return piece.replace("\u2581", " ").encode()

    def use_chat_template(self, template: str) -> None:
        """Render chats with ``template`` (Jinja) instead of the folder's own."""
        self.hf.chat_template = template

    def chat_template(self) -> str | None:
        """The Jinja chat template of the tokenizer's folder (or ``--chat-template``'s), if any."""
        return getattr(self.hf, "chat_template", None) or None

    def apply_chat_template(self, messages: list[dict], *, add_generation_prompt: bool = True,
                            max_chars: int | None = None, tools: list[dict] | None = None) -> str:
        from ..core.chat_template import render_chat_template
        if not getattr(self.hf, "chat_template", None):
            return render_chat_template(None, messages, add_generation_prompt=add_generation_prompt,
                                        max_chars=max_chars, tools=tools)
        try:  # transformers' own sandboxed renderer (the caller bounds the result's length)
            return self.hf.apply_chat_template(messages, tokenize=False, tools=tools,
                                               add_generation_prompt=add_generation_prompt)
        except Exception as exc:  # the template is the model's code: whatever it raises
            raise EdgespecError(f"the chat template (the model's, or --chat-template's) failed on these messages "
                                f"({type(exc).__name__}: {exc})") from None


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-to-printable-character table (byte-level BPE vocabularies)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def load_mlx_gguf(path: Path, *, name: str, n_ctx: int, quantize: str, kernels: str | None) -> MlxBackend:
    """A GGUF file on MLX: converted once to an MLX model (``quantize``: how its tensors
    are kept), with the file's own tokenizer."""
    from .gguf_tokenizer import GGUFTokenizer
    from .llama_lib import check_gguf_file
    check_gguf_file(path)
    from .gguf_mlx import convert_gguf
    folder = convert_gguf(path, quantize=quantize)
    model, _ = load_folder(folder)
    tokenizer = GGUFTokenizer.from_file(path)
    return MlxBackend(model, tokenizer, name=name, n_ctx=n_ctx, kernels=kernels, path=folder)


def load_mlx_folder(folder: Path, *, name: str, n_ctx: int, kernels: str | None) -> MlxBackend:
    """An mlx-lm model folder on MLX, with its Hugging Face tokenizer."""
    model, config = load_folder(folder)
    from mlx_lm.utils import load_tokenizer
    wrapper = load_tokenizer(folder)
    vocab_size = int(config.get("vocab_size") or wrapper.vocab_size)
    tokenizer = HFTokenizer(wrapper._tokenizer, vocab_size, wrapper.eos_token_ids)
    return MlxBackend(model, tokenizer, name=name, n_ctx=n_ctx, kernels=kernels, path=folder)


def load_folder(folder: Path):
    """An mlx-lm model folder's model and config (a clear error where mlx-lm cannot load it)."""
    from mlx_lm.utils import load_model
    if not (folder / "config.json").exists():
        raise EdgespecError(f"{folder} has no config.json: give an mlx-lm model folder, a Hub id "
                            f"or a .gguf file")
    try:
        return load_model(folder)
    except (FileNotFoundError, ValueError) as exc:
        raise EdgespecError(f"mlx-lm could not load {folder} ({exc})") from None
