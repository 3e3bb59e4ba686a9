"""Requantizing models: GGUF to GGUF through llama.cpp's quantizer, MLX through mlx-lm."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
from pathlib import Path
from typing import Callable

from ..errors import EdgespecError

# The types a user asks for by name, as llama-quantize spells them.
GGUF_TYPES = ("F16", "Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q5_0", "Q4_K_M", "Q4_K_S", "Q4_0",
              "Q4_1", "Q3_K_M", "Q3_K_S", "Q3_K_L", "Q2_K", "IQ4_NL", "IQ4_XS")
MLX_TYPES = ("8bit", "6bit", "4bit", "3bit", "2bit")
_TENSOR_LINE = re.compile(r"\[\s*(\d+)/\s*(\d+)\]")  # llama.cpp logs "[  12/ 290] name ..."

Progress = Callable[[int, int], None]


def quantize(source: str | os.PathLike, destination: str | os.PathLike, type_name: str, *,
             progress: Progress | None = None) -> Path:
    """Quantize ``source`` to ``type_name``: a GGUF type (Q4_0, ...) or an MLX one (4bit, ...)."""
    if type_name.lower() in MLX_TYPES:
        return quantize_mlx(source, destination, int(type_name.lower()[0]), progress=progress)
    return quantize_gguf(source, destination, type_name, progress=progress)


def quantize_gguf(source: str | os.PathLike, destination: str | os.PathLike, type_name: str, *,
                  n_threads: int | None = None, progress: Progress | None = None) -> Path:
    """Write ``source`` quantized to ``type_name`` (e.g. ``Q4_0``) at ``destination``.

    Already-quantized sources are requantized (as ``llama-quantize
    --allow-requantize``): quality is lower than quantizing from F16/BF16.
    ``progress(done, total)`` is called per tensor.
    """
    from ..backends.llama_lib import Log, check_gguf_file, llama

    name = type_name.upper()
    if name not in GGUF_TYPES:
        raise EdgespecError(f"unknown quantization type {type_name!r}: use a GGUF type "
                            f"({', '.join(GGUF_TYPES)}) or, for MLX, {', '.join(MLX_TYPES)}")
    source = check_gguf_file(source)
    destination = _output_path(source, destination)
    Log.install()
    params = llama.llama_model_quantize_default_params()
    params.ftype = getattr(llama, f"LLAMA_FTYPE_MOSTLY_{name}")
    params.allow_requantize = True
    params.nthread = n_threads or 0
    partial = destination.with_name(destination.name + ".partial")

    def listen(line: str) -> None:
        match = _TENSOR_LINE.search(line)
        if match and progress:
            progress(int(match.group(1)), int(match.group(2)))

    Log.listener = listen
    try:
        status = llama.llama_model_quantize(str(source).encode(), str(partial).encode(),
                                             ctypes.byref(params))
    finally:
        Log.listener = None
    if status != 0:
        partial.unlink(missing_ok=True)
        raise EdgespecError(f"llama.cpp could not quantize {source} to {name} "
                            f"({Log.last_error()}): try another type, or an F16 source")
    os.replace(partial, destination)
    return destination


def quantize_mlx(source: str | os.PathLike, destination: str | os.PathLike, bits: int, *,
                 group_size: int = 64, progress: Progress | None = None) -> Path:
    """Quantize an mlx-lm model folder (or a GGUF file, converted first) to ``bits``."""
    from ..backends.mlx_backend import load_folder  # imports mlx, with a clear error if missing
    from mlx_lm.utils import quantize_model, save_config, save_model

    source = Path(source).expanduser()
    if not source.exists():
        raise EdgespecError(f"model not found: {source}: give an mlx-lm folder or a .gguf file")
    if source.is_file():
        from ..backends.gguf_mlx import convert_gguf
        from ..backends.llama_lib import check_gguf_file
        folder = convert_gguf(check_gguf_file(source), quantize="none")
    else:
        folder = source
    destination = _output_path(source, destination)
    model, config = load_folder(folder)
    if "quantization" in config:
        raise EdgespecError(f"{source} is already quantized: start from a float model "
                            f"(an F16/F32 GGUF or an unquantized mlx-lm folder)")
    if progress:
        progress(0, 1)
    model, config = quantize_model(model, config, group_size, bits)
    save_model(destination, model)
    save_config(config, config_path=destination / "config.json")
    for extra in folder.glob("*"):
        if extra.name.startswith("tokenizer") or extra.name in ("special_tokens_map.json",
                                                                 "generation_config.json"):
            shutil.copy(extra, destination)
    if progress:
        progress(1, 1)
    return destination


def _output_path(source: Path, destination: str | os.PathLike) -> Path:
    destination = Path(destination).expanduser()
    if destination.exists() and destination.resolve() == source.resolve():
        raise EdgespecError("the output path is the input: give a new name")
    destination.parent.mkdir(parents=True, exist_ok=True)
    return destination
