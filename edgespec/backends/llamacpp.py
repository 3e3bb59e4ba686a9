"""The llama.cpp backend, on llama-cpp-python's low-level (C API) bindings.

One ``llama_decode`` per forward, with logits requested for exactly the
positions the caller needs (never for the whole context); rewind through the
memory API's sequence removal; tokenizer, special tokens and chat template
from the GGUF file. Draft and target each get their own model and context.
"""

from __future__ import annotations

import collections
import ctypes
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import EdgespecError
from .base import TokenizerMethods, VocabInfo, check_forward, closed_error
from .repack import ALL, CPU_ONLY, cpu_repack_overrides, repack_mode

try:
    import llama_cpp as _llama
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise EdgespecError(
        "the llama.cpp backend needs llama-cpp-python: pip install llama-cpp-python") from exc

_VOCAB_KINDS = {0: "none", 1: "spm", 2: "bpe", 3: "wpm", 4: "ugm", 5: "rwkv", 6: "plamo2"}
_GGML_LOG_ERROR = 4


class _Log:
    """Routes llama.cpp's log lines: silent by default, errors kept for messages."""

    lock = threading.Lock()
    errors: collections.deque = collections.deque(maxlen=8)
    verbose = bool(os.environ.get("EDGESPEC_VERBOSE"))
    installed = False

    listener = None  # a callable that sees every line (quantization progress)

    @staticmethod
    def _callback(level: int, text: bytes, _user_data) -> None:
        message = text.decode("utf-8", errors="replace") if text else ""
        if level == _GGML_LOG_ERROR and message.strip():
            _Log.errors.append(message.strip())
        if _Log.listener is not None:
            _Log.listener(message)
        if _Log.verbose:
            os.write(2, message.encode())

    # Keep a reference: ctypes callbacks are freed with their Python object.
    c_callback = _llama.llama_log_callback(_callback)

    @classmethod
    def install(cls) -> None:
        with cls.lock:
            if not cls.installed:
                _llama.llama_log_set(cls.c_callback, ctypes.c_void_p())
                _llama.llama_backend_init()
                cls.installed = True

    @classmethod
    def last_error(cls) -> str:
        """The first error llama.cpp logged since the last call (the specific one;
        later lines only say that loading failed)."""
        message = cls.errors[0] if cls.errors else "no details from llama.cpp"
        cls.errors.clear()
        return message


def physical_core_count() -> int:
    """Physical CPU cores: llama.cpp's own default for decoding threads."""
    if sys.platform == "darwin":  # performance cores (llama.cpp's choice on Apple Silicon)
        try:
            out = subprocess.run(["sysctl", "-n", "hw.perflevel0.physicalcpu"],
                                 capture_output=True, text=True, timeout=2)
            if out.returncode == 0 and out.stdout.strip().isdigit():
                return int(out.stdout.strip())
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        cores, physical_id = set(), None
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = (part.strip() for part in line.partition(":"))
                if key == "physical id":
                    physical_id = value
                elif key == "core id":
                    cores.add((physical_id, value))
        if cores:
            return len(cores)
    except OSError:
        pass
    return max(1, os.cpu_count() or 1)


def check_gguf_file(path: str | os.PathLike) -> Path:
    """Fail with a clear message unless ``path`` is an existing GGUF file."""
    path = Path(path).expanduser()
    if not path.exists():
        raise EdgespecError(
            f"model file not found: {path}: check the path, or give a model name "
            f"from `edgespec models list`")
    if path.is_dir():
        raise EdgespecError(
            f"{path} is a directory, not a GGUF file: pass the .gguf file inside it "
            f"(or use --backend mlx for an MLX model directory)")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise EdgespecError(
            f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF'): "
            f"pass a .gguf model file")
    return path


def _load_model(path: Path, *, n_gpu_layers: int = 0, vocab_only: bool = False,
                rpc: Sequence[str] = ()):
    """Load a GGUF file with llama.cpp (weights, or only its vocabulary); with
    ``rpc``, offload its layers to those ``rpc-server`` endpoints (then this
    machine's GPUs), as ``llama-cli --rpc`` does."""
    _Log.install()
    _Log.errors.clear()
    params = _llama.llama_model_default_params()
    params.n_gpu_layers = n_gpu_layers
    params.vocab_only = vocab_only
    mode = repack_mode()
    params.use_extra_bufts = mode == ALL
    overrides = None  # kept alive until the model is loaded
    if mode == CPU_ONLY and not vocab_only and n_gpu_layers == 0 and not rpc:
        overrides = cpu_repack_overrides(path)
        if overrides is not None:
            params.tensor_buft_overrides = ctypes.cast(overrides, ctypes.c_void_p).value
    devices = None
    if rpc:
        from .rpc import device_array, local_gpu_devices, rpc_devices
        devices = device_array(rpc_devices(rpc) + local_gpu_devices())
        params.devices = ctypes.cast(devices, ctypes.c_void_p).value
    model = _llama.llama_model_load_from_file(str(path).encode(), params)
    if model and rpc:
        from .rpc import hold
        hold(rpc)
    if not model:
        if rpc:
            raise EdgespecError(
                f"llama.cpp could not load {path} onto the RPC servers {','.join(rpc)} "
                f"({_Log.last_error()}): check that they have room for its layers (rpc-server -m) "
                f"and are still running")
        raise EdgespecError(
            f"llama.cpp could not load {path} ({_Log.last_error()}): the file is truncated "
            f"or corrupt; download it again (`edgespec models fetch NAME`)")
    return model


def _free_model(model, rpc: Sequence[str]) -> None:
    _llama.llama_model_free(model)
    if rpc:  # its connections to the servers close with it
        from .rpc import release
        release(rpc)


class GGUFTokenizer:
    """A GGUF file's tokenizer, special tokens and chat template, through llama.cpp.

    The MLX backend uses it too for GGUF files, so both backends tokenize a
    GGUF model identically.
    """

    def __init__(self, model, *, owns_model: bool = False):
        self._model = model
        self._owns_model = owns_model
        self._vocab = _llama.llama_model_get_vocab(model)
        self.vocab = self._read_vocab()
        self._unreadable = self._spm_without_byte_fallback()

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "GGUFTokenizer":
        """Load only the vocabulary of a GGUF file (no weights)."""
        return cls(_load_model(check_gguf_file(path), vocab_only=True), owns_model=True)

    def _read_vocab(self) -> VocabInfo:
        v = self._vocab
        size = _llama.llama_vocab_n_tokens(v)
        eog = frozenset(t for t in range(size) if _llama.llama_vocab_is_eog(v, t))
        specials = {}
        for label, fn in (("bos", _llama.llama_vocab_bos), ("eos", _llama.llama_vocab_eos),
                          ("eot", _llama.llama_vocab_eot), ("sep", _llama.llama_vocab_sep),
                          ("nl", _llama.llama_vocab_nl), ("pad", _llama.llama_vocab_pad),
                          ("fim_pre", _llama.llama_vocab_fim_pre),
                          ("fim_suf", _llama.llama_vocab_fim_suf),
                          ("fim_mid", _llama.llama_vocab_fim_mid)):
            token = fn(v)
            if token >= 0:
                specials[label] = int(token)
        bos = specials.get("bos") if _llama.llama_vocab_get_add_bos(v) else None
        return VocabInfo(size=size, kind=_VOCAB_KINDS.get(_llama.llama_vocab_type(v), "?"),
                         bos_token_id=bos, eos_token_ids=eog, special_token_ids=specials)

    def _spm_without_byte_fallback(self) -> tuple[set[str], list[str]] | None:
        """For a SentencePiece vocabulary that lacks some of the 256 byte tokens:
        the characters it has tokens for, and its special tokens' texts.

        llama.cpp spells a character the vocabulary lacks as byte tokens, and
        aborts the process (``std::out_of_range``) where those are missing, so
        :meth:`tokenize` must refuse such text first. None: every text is safe.
        """
        if self.vocab.kind != "spm":
            return None
        v, byte_attr = self._vocab, _llama.LLAMA_TOKEN_ATTR_BYTE
        special = _llama.LLAMA_TOKEN_ATTR_CONTROL | _llama.LLAMA_TOKEN_ATTR_USER_DEFINED
        texts = [(self.token_text(t), _llama.llama_vocab_get_attr(v, t)) for t in range(self.vocab.size)]
        if {f"<0x{b:02X}>" for b in range(256)} <= {text for text, attr in texts if attr & byte_attr}:
            return None
        chars = {text for text, attr in texts if len(text) == 1 and not attr & special}
        return chars, [text for text, attr in texts if attr & special and text]

    def _check_spelled(self, text: str, special: bool) -> None:
        """Refuse ``text`` with a character this vocabulary can only spell in bytes it lacks."""
        chars, specials = self._unreadable
        if special:  # special tokens are cut out before the text is split into characters
            for piece in specials:
                text = text.replace(piece, "")
        for char in dict.fromkeys(text.replace(" ", "\u2581")):  # (in order: the first named)
            if char not in chars:
                raise EdgespecError(
                    f"this model's vocabulary has no token for {char!r} and no byte tokens to "
                    f"spell it with (a SentencePiece vocabulary without byte fallback): "
                    f"remove that character from the text, or use a model with a complete vocabulary")

    def _live(self):
        """The vocabulary pointer; after close() an error, not a read of freed memory."""
        if self._vocab is None:
            raise closed_error("the tokenizer")
        return self._vocab

    def token_text(self, token_id: int) -> str:
        """The vocabulary's stored text of a token (for compatibility checks)."""
        return _llama.llama_vocab_get_text(self._live(), token_id).decode("utf-8", errors="replace")

    def tokenize(self, text: str, *, add_bos: bool = True, special: bool = True) -> list[int]:
        vocab = self._live()
        if self._unreadable:
            self._check_spelled(text, special)
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buffer = (_llama.llama_token * capacity)()
        n = _llama.llama_tokenize(vocab, data, len(data), buffer, capacity, add_bos, special)
        if n < 0:  # buffer too small: -n is the size needed
            capacity = -n
            buffer = (_llama.llama_token * capacity)()
            n = _llama.llama_tokenize(vocab, data, len(data), buffer, capacity, add_bos, special)
        return list(buffer[:n])

    def token_bytes(self, token_id: int) -> bytes:
        vocab = self._live()
        buffer = ctypes.create_string_buffer(64)
        n = _llama.llama_token_to_piece(vocab, token_id, buffer, 64, 0, True)
        if n < 0:
            buffer = ctypes.create_string_buffer(-n)
            n = _llama.llama_token_to_piece(vocab, token_id, buffer, -n, 0, True)
        return buffer.raw[:n]

    def chat_template(self) -> str | None:
        """The Jinja chat template stored in the GGUF metadata, if any."""
        self._live()
        template = _llama.llama_model_chat_template(self._model, None)
        return template.decode("utf-8") if template else None

    def apply_chat_template(self, messages: list[dict], *, add_generation_prompt: bool = True,
                            max_chars: int | None = None) -> str:
        from ..chat_template import render_chat_template
        return render_chat_template(
            self.chat_template(), messages, add_generation_prompt=add_generation_prompt,
            bos_token=self._special_text("bos"), eos_token=self._special_text("eos"),
            max_chars=max_chars)

    def _special_text(self, label: str) -> str:
        token = self.vocab.special_token_ids.get(label)
        return self.token_text(token) if token is not None else ""

    def close(self) -> None:
        """Forget the model (and free it if this tokenizer loaded it); later calls raise."""
        self._vocab = None
        if self._owns_model and self._model:
            _llama.llama_model_free(self._model)
        self._model = None


class LlamaCppBackend(TokenizerMethods):
    """A GGUF model on llama.cpp, behind the :class:`~edgespec.backends.base.Backend` protocol."""

    def __init__(self, model_path: str | os.PathLike, *, n_ctx: int = 4096,
                 n_threads: int | None = None, n_gpu_layers: int = 0,
                 flash_attn: bool | None = None, n_batch: int = 512, kv_cache_type: str = "f16",
                 name: str | None = None, rpc: Sequence[str] = ()):
        path = check_gguf_file(model_path)
        self.path = path
        self.name = name or path.stem
        self.n_threads = n_threads or physical_core_count()
        self.rpc = tuple(rpc)  # rpc-server endpoints holding its layers
        if self.rpc and n_gpu_layers == 0:
            n_gpu_layers = -1  # all of them: --rpc means the layers go there (-ngl N: only N)
        self.n_gpu_layers = n_gpu_layers

        self._model = _load_model(path, n_gpu_layers=n_gpu_layers, rpc=self.rpc)
        self.tokenizer = GGUFTokenizer(self._model)
        self.vocab = self.tokenizer.vocab

        ctx_params = _llama.llama_context_default_params()
        ctx_params.n_ctx = n_ctx
        ctx_params.n_batch = min(n_batch, n_ctx)
        ctx_params.n_ubatch = min(n_batch, n_ctx)
        ctx_params.n_seq_max = 1
        ctx_params.n_threads = self.n_threads
        ctx_params.n_threads_batch = self.n_threads
        ctx_params.flash_attn_type = {None: _llama.LLAMA_FLASH_ATTN_TYPE_AUTO,
                                      True: _llama.LLAMA_FLASH_ATTN_TYPE_ENABLED,
                                      False: _llama.LLAMA_FLASH_ATTN_TYPE_DISABLED}[flash_attn]
        ctx_params.no_perf = True
        # llama.cpp keeps K/V in f16 by default; f32 makes logits comparable to float32 exactly.
        ctx_params.type_k = ctx_params.type_v = {"f16": 1, "f32": 0}[kv_cache_type]
        self._ctx = _llama.llama_init_from_model(self._model, ctx_params)
        if not self._ctx:
            self.tokenizer.close()
            _free_model(self._model, self.rpc)
            self._model = None  # (or __del__ would free it twice)
            raise EdgespecError(
                f"llama.cpp could not create a context of {n_ctx} tokens for {path} "
                f"({_Log.last_error()}): try a smaller --ctx")
        self._memory = _llama.llama_get_memory(self._ctx)
        self.n_ctx = _llama.llama_n_ctx(self._ctx)
        self.n_batch = ctx_params.n_batch
        self._batch = _llama.llama_batch_init(self.n_batch, 0, 1)
        self._n_past = 0
        self.n_vocab = self.vocab.size

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
        status = _llama.llama_decode(self._ctx, batch)
        if status != 0:
            # The failed batch may have been partly stored: drop it.
            _llama.llama_memory_seq_rm(self._memory, 0, self._n_past, -1)
            if status == 1:
                raise EdgespecError(
                    f"no room in the KV cache for {n} more tokens: raise --ctx")
            raise EdgespecError(f"llama.cpp failed to evaluate the batch (llama_decode returned "
                                f"{status}; {_Log.last_error()})")
        self._n_past += n
        if not want_logits:
            return None
        n_rows = 1 if last_only else n
        # The rows requested are stored contiguously; copy once, as they are
        # overwritten by the next decode.
        pointer = _llama.llama_get_logits(self._ctx)
        return np.ctypeslib.as_array(pointer, shape=(n_rows, self.n_vocab)).copy()

    def rewind(self, n_past: int) -> None:
        # Always remove from the KV cache itself: after an interrupted decode (Ctrl-C
        # lands right after llama_decode returns) it may hold more than _n_past says.
        if not self._ctx:
            raise closed_error(self.name)
        if not _llama.llama_memory_seq_rm(self._memory, 0, n_past, -1):
            raise EdgespecError(
                f"{self.name} cannot rewind its cache (recurrent or sliding-window memory): "
                f"speculative decoding needs a model whose KV cache can be trimmed")
        self._n_past = min(self._n_past, n_past)

    @property
    def memory_bytes(self) -> int:
        """Bytes of model weights llama.cpp holds."""
        return int(_llama.llama_model_size(self._model)) if self._model else 0

    def close(self) -> None:
        """Free the context and the model (the backend is unusable afterwards)."""
        if getattr(self, "tokenizer", None) is not None:
            self.tokenizer.close()  # it shares the model pointer freed below
        if getattr(self, "_ctx", None):
            _llama.llama_batch_free(self._batch)
            _llama.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            _free_model(self._model, self.rpc)
            self._model = None

    def __del__(self):  # pragma: no cover - best effort at interpreter shutdown
        try:
            self.close()
        except Exception:
            pass
