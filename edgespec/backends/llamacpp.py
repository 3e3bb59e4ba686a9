"""The llama.cpp backend, on llama-cpp-python's low-level (C API) bindings.

One ``llama_decode`` per forward, with logits requested for exactly the
positions the caller needs (never for the whole context); rewind through the
memory API's sequence removal; tokenizer, special tokens and chat template
from the GGUF file (:mod:`.gguf_tokenizer`). Draft and target each get their
own model and context.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
from typing import Sequence

import numpy as np

from ..core.acceptance import HostVerify
from ..errors import EdgespecError
from ..core.backend import BackendFacts, TokenizerMethods, check_forward, closed_error
from .gguf_tokenizer import GGUFTokenizer
from .kernels import EXACT, EXACT_KV_CACHE, check_exact_settings, kernel_mode, prefill_invariant, probe
from .llama_lib import (CACHE_TYPES, Log, cache_type, check_gguf_file, free_model, llama, load_model,
                        physical_core_count)
from ..paths import model_identity

def _pair(a, b) -> str:
    """Two settings as a saved state's key says them ("a", or "a:b" where they differ)."""
    return str(a) if a == b else f"{a}:{b}"


def _bytes(array: np.ndarray):
    """A uint8 numpy array as the ``uint8_t *`` llama.cpp's state functions take."""
    return array.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))


class LlamaCppBackend(TokenizerMethods, BackendFacts, HostVerify):
    """A GGUF model on llama.cpp, behind the :class:`~edgespec.core.backend.Backend` protocol."""

    def __init__(self, model_path: str | os.PathLike, *, n_ctx: int = 4096,
                 n_threads: int | None = None, n_gpu_layers: int = 0,
                 flash_attn: bool | None = None, n_batch: int = 512, n_ubatch: int | None = None,
                 kv_cache_type: str = "f16", type_k: str | None = None, type_v: str | None = None,
                 use_mmap: bool = True, name: str | None = None, rpc: Sequence[str] = (),
                 kernels: str | None = None):
        """``n_batch``/``n_ubatch``: llama.cpp's logical and physical batch (-b/-ub; the
        physical one is n_batch unless given); ``type_k``/``type_v``: the K and V cache
        types (-ctk/-ctv), each ``kv_cache_type`` unless given; ``use_mmap=False``: read
        the file into memory instead of mapping it (--no-mmap)."""
        path = check_gguf_file(model_path)
        self.path = path
        self.name = name or path.stem
        self.n_threads = n_threads or physical_core_count()
        self.rpc = tuple(rpc)  # rpc-server endpoints holding its layers
        if self.rpc and n_gpu_layers == 0:
            n_gpu_layers = -1  # all of them: --rpc means the layers go there (-ngl N: only N)
        self.n_gpu_layers = n_gpu_layers
        # Bit-exact kernels (backends/kernels.py): only on the CPU, where they are known.
        self.kernels = kernel_mode(kernels)
        self.exact_chunk = 0  # with exact kernels: the longest pass that rounds as one-token steps
        if self.kernels != EXACT:
            self.not_exact = "fast kernels: a batched pass and a one-token pass round differently"
        elif n_gpu_layers or self.rpc:
            self.not_exact = "GPU or RPC offload: no batch-invariant kernels are known there"
        else:
            self.not_exact = None
            check_exact_settings(flash_attn, type_k, type_v)
            flash_attn, kv_cache_type = True, EXACT_KV_CACHE
            type_k = type_v = None
        type_k, type_v = cache_type(type_k or kv_cache_type, "-ctk"), cache_type(type_v or kv_cache_type, "-ctv")
        for flag, size in (("-b", n_batch), ("-ub", n_ubatch)):
            if size is not None and size < 1:
                raise EdgespecError(f"invalid {flag} {size}: a batch holds at least 1 token")
        if type_v not in ("f32", "f16", "bf16") and flash_attn is False:
            raise EdgespecError(f"-ctv {type_v} (a quantized V cache) needs flash attention: "
                                f"use -fa on or auto")

        self._model = load_model(path, n_gpu_layers=n_gpu_layers, rpc=self.rpc, use_mmap=use_mmap)
        self.tokenizer = GGUFTokenizer(self._model)
        self.vocab = self.tokenizer.vocab

        ctx_params = llama.llama_context_default_params()
        ctx_params.n_ctx = n_ctx
        ctx_params.n_batch = min(n_batch, n_ctx)
        ctx_params.n_ubatch = min(n_ubatch or n_batch, ctx_params.n_batch)
        ctx_params.n_seq_max = 1
        ctx_params.n_threads = self.n_threads
        ctx_params.n_threads_batch = self.n_threads
        ctx_params.flash_attn_type = {None: llama.LLAMA_FLASH_ATTN_TYPE_AUTO,
                                      True: llama.LLAMA_FLASH_ATTN_TYPE_ENABLED,
                                      False: llama.LLAMA_FLASH_ATTN_TYPE_DISABLED}[flash_attn]
        ctx_params.no_perf = True
        # llama.cpp keeps K/V in f16 by default; f32 makes logits comparable to float32 exactly.
        ctx_params.type_k, ctx_params.type_v = CACHE_TYPES[type_k], CACHE_TYPES[type_v]
        self._ctx = llama.llama_init_from_model(self._model, ctx_params)
        if not self._ctx:
            self.tokenizer.close()
            free_model(self._model, self.rpc)
            self._model = None  # (or __del__ would free it twice)
            raise EdgespecError(
                f"llama.cpp could not create a context of {n_ctx} tokens for {path} "
                f"({Log.last_error()}): try a smaller --ctx")
        self._memory = llama.llama_get_memory(self._ctx)
        self.n_ctx = llama.llama_n_ctx(self._ctx)
        self.n_batch = ctx_params.n_batch
        self._batch = llama.llama_batch_init(self.n_batch, 0, 1)
        self._n_past = 0
        self.n_vocab = self.vocab.size
        if self.not_exact is None:
            self.exact_chunk, self.not_exact = probe(self)
        self.bit_exact = self.not_exact is None
        self.exact_prefill = self.bit_exact and prefill_invariant(self)
        import llama_cpp
        system = hashlib.sha256(llama.llama_print_system_info()).hexdigest()[:12]
        self.state_key = "|".join([
            model_identity(path), f"llama.cpp {llama_cpp.__version__}", f"ctx={self.n_ctx}",
            f"batch={_pair(self.n_batch, ctx_params.n_ubatch)}", f"kv={_pair(type_k, type_v)}",
            f"flash_attn={flash_attn}",
            f"kernels={self.kernels}:{self.exact_chunk}:{int(self.exact_prefill)}",
            f"gpu_layers={n_gpu_layers}", f"rpc={','.join(self.rpc) or 'none'}", f"system={system}"])

    # -- evaluation ---------------------------------------------------------------

    @property
    def n_past(self) -> int:
        return self._n_past

    def forward(self, tokens: Sequence[int], *, last_only: bool = False) -> np.ndarray:
        """Decode ``tokens`` after the cache; logits ``[n, V]`` (or ``[1, V]``) as float32."""
        if not self._ctx:
            raise closed_error(self.name)
        n = len(tokens)
        check_forward(self._n_past, n, self.n_ctx)
        if self.exact_chunk and not last_only and n > self.exact_chunk:
            # Exact kernels: a verify pass in pieces that round as one-token steps.
            c = self.exact_chunk
            return np.concatenate([self._decode(tokens[i:i + c], want_logits=True)
                                   for i in range(0, n, c)])
        # Long inputs (prompts) go in n_batch chunks; logits only come from the last chunk.
        start = 0
        while n - start > self.n_batch:
            self._decode(tokens[start:start + self.n_batch], want_logits=False)
            start += self.n_batch
        rows = self._decode(tokens[start:], want_logits=True, last_only=last_only)
        return rows

    def _decode(self, tokens: Sequence[int], *, want_logits: bool, last_only: bool = False):
        batch = self._batch
        n = len(tokens)
        batch.n_tokens = n
        for i, token in enumerate(tokens):
            batch.token[i] = token
            batch.pos[i] = self._n_past + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = want_logits and not last_only
        if want_logits:
            batch.logits[n - 1] = True
        status = llama.llama_decode(self._ctx, batch)
        if status != 0:
            # The failed batch may have been partly stored: drop it.
            llama.llama_memory_seq_rm(self._memory, 0, self._n_past, -1)
            if status == 1:
                raise EdgespecError(
                    f"no room in the KV cache for {n} more tokens: raise --ctx")
            raise EdgespecError(f"llama.cpp failed to evaluate the batch (llama_decode returned "
                                f"{status}; {Log.last_error()})")
        self._n_past += n
        if not want_logits:
            return None
        n_rows = 1 if last_only else n
        # The rows requested are stored contiguously; copy once, as they are
        # overwritten by the next decode.
        pointer = llama.llama_get_logits(self._ctx)
        return np.ctypeslib.as_array(pointer, shape=(n_rows, self.n_vocab)).copy()

    def rewind(self, n_past: int) -> None:
        # Always remove from the KV cache itself: after an interrupted decode (Ctrl-C
        # lands right after llama_decode returns) it may hold more than _n_past says.
        if not self._ctx:
            raise closed_error(self.name)
        if not llama.llama_memory_seq_rm(self._memory, 0, n_past, -1):
            raise EdgespecError(
                f"{self.name} cannot rewind its cache (recurrent or sliding-window memory): "
                f"speculative decoding needs a model whose KV cache can be trimmed")
        self._n_past = min(self._n_past, n_past)

    def save_state(self) -> np.ndarray | None:
        """The KV cache's contents (sequence 0, as ``llama_state_seq_get_data`` writes
        it: its cells, positions and K/V rows) in host memory; None if llama.cpp
        cannot write them."""
        if not self._ctx:
            raise closed_error(self.name)
        size = llama.llama_state_seq_get_size(self._ctx, 0)
        state = np.empty(size, dtype=np.uint8)
        written = llama.llama_state_seq_get_data(self._ctx, _bytes(state), size, 0) if size else 0
        return state[:written] if written else None

    def state_bytes(self, state: np.ndarray) -> np.ndarray:
        """A :meth:`save_state` copy is its bytes already."""
        return state

    def load_state(self, state: np.ndarray) -> None:
        """Replace the KV cache's contents with a :meth:`save_state` copy (or its bytes
        read back from a file)."""
        if not self._ctx:
            raise closed_error(self.name)
        llama.llama_memory_seq_rm(self._memory, 0, 0, -1)
        self._n_past = 0
        if not llama.llama_state_seq_set_data(self._ctx, _bytes(state), state.nbytes, 0):
            llama.llama_memory_seq_rm(self._memory, 0, 0, -1)
            raise EdgespecError(f"{self.name} refused a saved state (another model or context size)")
        self._n_past = llama.llama_memory_seq_pos_max(self._memory, 0) + 1

    def shift(self, start: int, end: int, delta: int) -> bool:
        """Move the cells at positions [start, end) by ``delta`` (< 0), dropping those at
        [start + delta, start) first (llama-server's ``--cache-reuse``); llama.cpp rotates
        their keys to the new positions at the next decode. False where the memory cannot
        shift (e.g. a recurrent model)."""
        if not self._ctx:
            raise closed_error(self.name)
        if delta >= 0 or start + delta < 0 or not llama.llama_memory_can_shift(self._memory):
            return False
        llama.llama_memory_seq_rm(self._memory, 0, start + delta, start)
        llama.llama_memory_seq_add(self._memory, 0, start, end, delta)
        return True

    @property
    def memory_bytes(self) -> int:
        """Bytes of model weights llama.cpp holds."""
        return int(llama.llama_model_size(self._model)) if self._model else 0

    def close(self) -> None:
        """Free the context and the model (the backend is unusable afterwards)."""
        if getattr(self, "tokenizer", None) is not None:
            self.tokenizer.close()  # it shares the model pointer freed below
        if getattr(self, "_ctx", None):
            llama.llama_batch_free(self._batch)
            llama.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            free_model(self._model, self.rpc)
            self._model = None

    def __del__(self):  # pragma: no cover - best effort at interpreter shutdown
        try:
            self.close()
        except Exception:
            pass
