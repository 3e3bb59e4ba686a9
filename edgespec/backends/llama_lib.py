"""llama.cpp itself, through llama-cpp-python's low-level bindings: the library,
its log, and loading a GGUF file (weights, or only its vocabulary).

Every module that touches llama.cpp imports it from here, so the library is
initialised, and its log routed, in one place.
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

from ..errors import EdgespecError
from .repack import ALL, CPU_ONLY, cpu_repack_overrides, repack_mode

try:
    import llama_cpp as llama
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise EdgespecError(
        "the llama.cpp backend needs llama-cpp-python: pip install llama-cpp-python") from exc

VOCAB_KINDS = {0: "none", 1: "spm", 2: "bpe", 3: "wpm", 4: "ugm", 5: "rwkv", 6: "plamo2"}
_GGML_LOG_ERROR = 4


class Log:
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
            Log.errors.append(message.strip())
        if Log.listener is not None:
            Log.listener(message)
        if Log.verbose:
            os.write(2, message.encode())

    # Keep a reference: ctypes callbacks are freed with their Python object.
    c_callback = llama.llama_log_callback(_callback)

    @classmethod
    def install(cls) -> None:
        with cls.lock:
            if not cls.installed:
                llama.llama_log_set(cls.c_callback, ctypes.c_void_p())
                llama.llama_backend_init()
                cls.installed = True

    @classmethod
    def last_error(cls) -> str:
        """The first error llama.cpp logged since the last call (the specific one;
        later lines only say that loading failed)."""
        message = cls.errors[0] if cls.errors else "no details from llama.cpp"
        cls.errors.clear()
        return message


def gpu_offload_supported() -> bool:
    """Whether this llama-cpp-python build can offload layers to a GPU (CUDA, Metal, ...)."""
    return bool(llama.llama_supports_gpu_offload())


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


# The K/V cache types llama.cpp's -ctk/-ctv take, as ggml's type ids.
CACHE_TYPES = {"f32": 0, "f16": 1, "bf16": 30, "q8_0": 8, "q4_0": 2, "q4_1": 3, "iq4_nl": 20,
               "q5_0": 6, "q5_1": 7}


def cache_type(name: str, flag: str) -> str:
    """A K/V cache type name (lower case), or a clear error naming ``flag``."""
    if name.lower() not in CACHE_TYPES:
        raise EdgespecError(f"invalid {flag} {name!r}: use one of {', '.join(CACHE_TYPES)}")
    return name.lower()


def load_model(path: Path, *, n_gpu_layers: int = 0, vocab_only: bool = False,
               rpc: Sequence[str] = (), use_mmap: bool = True):
    """Load a GGUF file with llama.cpp (weights, or only its vocabulary); with
    ``rpc``, offload its layers to those ``rpc-server`` endpoints (then this
    machine's GPUs), as ``llama-cli --rpc`` does; ``use_mmap=False`` reads the file
    into memory instead of mapping it (--no-mmap)."""
    Log.install()
    Log.errors.clear()
    params = llama.llama_model_default_params()
    params.n_gpu_layers = n_gpu_layers
    params.vocab_only = vocab_only
    params.use_mmap = use_mmap
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
    model = llama.llama_model_load_from_file(str(path).encode(), params)
    if model and rpc:
        from .rpc import hold
        hold(rpc)
    if not model:
        if rpc:
            raise EdgespecError(
                f"llama.cpp could not load {path} onto the RPC servers {','.join(rpc)} "
                f"({Log.last_error()}): check that they have room for its layers (rpc-server -m) "
                f"and are still running")
        raise EdgespecError(
            f"llama.cpp could not load {path} ({Log.last_error()}): the file is truncated "
            f"or corrupt; download it again (`edgespec models fetch NAME`)")
    return model


def free_model(model, rpc: Sequence[str]) -> None:
    llama.llama_model_free(model)
    if rpc:  # its connections to the servers close with it
        from .rpc import release
        release(rpc)
