"""Requantizing models: GGUF to GGUF through llama.cpp's quantizer."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from .errors import EdgespecError

# The types a user asks for by name, as llama-quantize spells them.
GGUF_TYPES = ("F16", "Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q5_0", "Q4_K_M", "Q4_K_S", "Q4_0",
              "Q4_1", "Q3_K_M", "Q3_K_S", "Q3_K_L", "Q2_K", "IQ4_NL", "IQ4_XS")


def quantize_gguf(source: str | os.PathLike, destination: str | os.PathLike, type_name: str, *,
                  n_threads: int | None = None) -> Path:
    """Write ``source`` quantized to ``type_name`` (e.g. ``Q4_0``) at ``destination``.

    Already-quantized sources are requantized (as ``llama-quantize
    --allow-requantize``): quality is lower than quantizing from F16/BF16.
    """
    from .backends.llamacpp import _llama, _Log, check_gguf_file

    name = type_name.upper()
    if name not in GGUF_TYPES:
        raise EdgespecError(f"unknown GGUF quantization type {type_name!r}: "
                            f"use one of {', '.join(GGUF_TYPES)}")
    source = check_gguf_file(source)
    destination = Path(destination).expanduser()
    if destination.resolve() == source.resolve():
        raise EdgespecError("the output path is the input file: give a new file name")
    destination.parent.mkdir(parents=True, exist_ok=True)
    _Log.install()
    params = _llama.llama_model_quantize_default_params()
    params.ftype = getattr(_llama, f"LLAMA_FTYPE_MOSTLY_{name}")
    params.allow_requantize = True
    params.nthread = n_threads or 0
    partial = destination.with_name(destination.name + ".partial")
    status = _llama.llama_model_quantize(str(source).encode(), str(partial).encode(),
                                         ctypes.byref(params))
    if status != 0:
        partial.unlink(missing_ok=True)
        raise EdgespecError(f"llama.cpp could not quantize {source} to {name} "
                            f"({_Log.last_error()}): try another type, or an F16 source")
    os.replace(partial, destination)
    return destination
