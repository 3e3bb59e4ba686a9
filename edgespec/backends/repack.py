"""Which weights llama.cpp repacks for its CPU matrix kernels, and into what.

llama.cpp can copy quantized weights into *extra* CPU buffer types, laid out so
that its kernels multiply several rows of a batch at once: CPU_REPACK (Q4_0,
Q4_K, IQ4_NL with AVX2 or NEON, Q2_K with AVX-512) and, on Intel CPUs with AMX,
an AMX buffer. A one-token step hardly changes, but batched passes -- what
speculative decoding verifies with -- get much cheaper: on two Xeon cores a
4-token pass of Qwen2.5-Coder-1.5B (Q4_K_M) costs ~1.5 one-token steps with
CPU_REPACK and ~2.4 without.

The AMX buffer crashes on the first batched pass (SIGILL here; llama.cpp
#20824), and llama.cpp's only switch (``--no-repack``, ``use_extra_bufts``)
turns both off. So on AMX CPUs edgespec turns the extra buffers off and places
the weights CPU_REPACK can take there itself, by per-tensor buffer overrides
(llama.cpp's ``-ot NAME=BUFFER``, which its tools cannot spell for CPU_REPACK).

``EDGESPEC_LLAMA_REPACK`` overrides the choice: ``1`` all extra buffers
(llama.cpp's default), ``cpu`` CPU_REPACK only, ``0`` none.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
import re
import struct
from collections import defaultdict
from pathlib import Path

ALL, CPU_ONLY, OFF = "all", "cpu", "off"

# Weights of matrix multiplications, by their name in a layer (GGUF naming); the
# repack buffer serves matrix multiplications only (not, say, the embedding lookup).
_MATMUL_WEIGHTS = ("attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output",
                   "ffn_gate", "ffn_up", "ffn_down")
_LAYER_WEIGHT = re.compile(r"^blk\.(\d+)\.(%s)\.weight$" % "|".join(_MATMUL_WEIGHTS))


def _has_amx() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return "amx_int8" in line.split()
    except OSError:
        pass
    return False


def repack_mode() -> str:
    """``"all"`` (llama.cpp's extra buffers), ``"cpu"`` (CPU_REPACK only) or ``"off"``."""
    forced = os.environ.get("EDGESPEC_LLAMA_REPACK")
    if forced in ("0", "1", "cpu"):
        return {"0": OFF, "1": ALL, "cpu": CPU_ONLY}[forced]
    return CPU_ONLY if _has_amx() else ALL


def use_extra_buffer_types() -> bool:
    """Whether llama.cpp's own extra-buffer switch is on (``--repack`` of its tools)."""
    return repack_mode() == ALL


class _CpuRepack:
    """The CPU_REPACK buffer type and the CPU features its layouts need, through ctypes."""

    def __init__(self):
        from llama_cpp._ggml import libggml

        from .rpc import ggml_functions
        ggml = ggml_functions()
        cpu = ggml.ggml_backend_reg_by_name(b"CPU")
        address = ggml.ggml_backend_reg_get_proc_address(cpu, b"ggml_backend_dev_get_extra_bufts")
        if not cpu or not address:
            raise OSError("this llama.cpp has no extra CPU buffer types")
        extra = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(address)(
            ggml.ggml_backend_reg_dev_get(cpu, 0))
        self.buffer_type = None
        for i in range(16):
            if not extra[i]:
                break
            if ggml.ggml_backend_buft_name(extra[i]) == b"CPU_REPACK":
                self.buffer_type = extra[i]
        if self.buffer_type is None:
            raise OSError("this llama.cpp has no CPU_REPACK buffer type")
        cpu_lib = ctypes.CDLL(str(Path(libggml._name).with_name("libggml-cpu.so")))
        self.avx2 = bool(cpu_lib.ggml_cpu_has_avx2())
        self.avx512 = bool(cpu_lib.ggml_cpu_has_avx512())


@functools.lru_cache(maxsize=1)
def _cpu_repack() -> _CpuRepack | None:
    try:
        return _CpuRepack()
    except (OSError, AttributeError, ValueError):
        return None


# GGUF metadata value types: fixed sizes, 8 a string, 9 an array.
_GGUF_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def tensor_infos(path: str | os.PathLike) -> list[tuple[str, int, tuple[int, ...]]]:
    """(name, ggml type, shape in ggml order) of every tensor in a GGUF file.

    Read from the header directly: gguf-py's reader decodes every metadata value
    first (the vocabulary too), which takes ~10 s on a Qwen2.5 file.
    """
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
        at = 24

        def string(at: int) -> int:  # the offset after a string
            return at + 8 + struct.unpack_from("<Q", data, at)[0]

        def value(kind: int, at: int) -> int:  # the offset after a value of this kind
            if kind in _GGUF_SIZES:
                return at + _GGUF_SIZES[kind]
            if kind == 8:
                return string(at)
            if kind != 9:
                raise ValueError(f"{path}: unknown GGUF value type {kind}")
            item, count = struct.unpack_from("<IQ", data, at)
            at += 12
            if item in _GGUF_SIZES:
                return at + count * _GGUF_SIZES[item]
            for _ in range(count):
                at = value(item, at)
            return at

        for _ in range(n_kv):
            at = string(at)
            at = value(struct.unpack_from("<I", data, at)[0], at + 4)
        infos = []
        for _ in range(n_tensors):
            end = string(at)
            name = bytes(data[at + 8:end]).decode()
            n_dims = struct.unpack_from("<I", data, end)[0]
            shape = struct.unpack_from(f"<{n_dims}Q", data, end + 4)
            kind = struct.unpack_from("<I", data, end + 4 + 8 * n_dims)[0]
            infos.append((name, kind, tuple(shape)))
            at = end + 4 + 8 * n_dims + 4 + 8
        return infos


def repackable_tensors(path: str | os.PathLike, *, avx2: bool = True,
                       avx512: bool = False) -> list[str]:
    """The weights of the GGUF file at ``path`` that CPU_REPACK lays out on x86
    (as ggml's ``ggml_repack_get_optimal_repack_type``: the tensor type, and
    rows in groups of 8). A tensor it cannot take would crash llama.cpp, so
    this errs on the side of leaving one out."""
    from gguf import GGMLQuantizationType as T
    types = ({T.Q4_0, T.Q4_K, T.IQ4_NL} if avx2 else set()) | ({T.Q2_K} if avx512 else set())
    return [name for name, kind, shape in tensor_infos(path)
            if kind in types and len(shape) == 2 and shape[1] % 8 == 0  # ne[1]: rows
            and (_LAYER_WEIGHT.match(name) or name == "output.weight")]


def tensor_pattern(names: list[str]) -> str:
    """One regular expression (ECMAScript, as llama.cpp reads it) matching exactly ``names``."""
    layers = defaultdict(list)
    alternatives = []
    for name in names:
        match = _LAYER_WEIGHT.match(name)
        if match:
            layers[match.group(2)].append(match.group(1))
        else:
            alternatives.append(re.escape(name.removesuffix(".weight")))
    for weight, numbers in layers.items():
        alternatives.append(r"blk\.(?:%s)\.%s" % ("|".join(numbers), weight))
    return r"^(?:%s)\.weight$" % "|".join(alternatives)


class _Override(ctypes.Structure):
    """llama.cpp's ``llama_model_tensor_buft_override``."""
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def cpu_repack_overrides(path: str | os.PathLike):
    """The ``tensor_buft_overrides`` array that puts the weights of ``path`` that
    CPU_REPACK can take there, or None (nothing to repack, or no CPU_REPACK).
    The caller keeps it alive until the model is loaded."""
    repack = _cpu_repack()
    if repack is None:
        return None
    try:
        names = repackable_tensors(path, avx2=repack.avx2, avx512=repack.avx512)
    except Exception:  # a header this cannot read: llama.cpp's load says what is wrong
        return None
    if not names:
        return None
    overrides = (_Override * 2)()
    overrides[0].pattern = tensor_pattern(names).encode()
    overrides[0].buft = repack.buffer_type
    return overrides


def describe() -> str:
    """The repacking in effect, for ``edgespec info``."""
    mode = repack_mode()
    if mode == ALL:
        return "on (llama.cpp's extra CPU buffers)"
    if mode == OFF:
        return "off (EDGESPEC_LLAMA_REPACK=0)"
    if _cpu_repack() is None:
        return "off (Intel AMX, and this llama.cpp has no CPU_REPACK buffer to use instead)"
    return ("CPU_REPACK only (Intel AMX: llama.cpp's AMX buffer crashes on batched passes; "
            "EDGESPEC_LLAMA_REPACK=1 forces it on)")
