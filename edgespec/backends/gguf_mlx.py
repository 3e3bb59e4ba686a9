"""GGUF files as mlx-lm models (llama and qwen2 architectures).

Q4_0, Q4_1 and Q8_0 tensors load directly with ``mx.load`` as MLX quantized
arrays (group size 32). Files with other types (K-quants, Q5_0, …) are
dequantized with the ``gguf`` package and, by default, quantized again to
MLX 4-bit (``quantize="8bit"`` or ``"none"`` for float weights). llama.cpp
stores the llama architecture's Q/K projection rows permuted for its rope;
the conversion undoes that. The result is cached as an mlx-lm model folder
(``config.json`` + ``model.safetensors``) so the second load is fast.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np

from ..errors import EdgespecError
from ..paths import edgespec_home

SUPPORTED_ARCHITECTURES = ("llama", "qwen2")
QUANTIZE_CHOICES = ("4bit", "8bit", "none")
_DIRECT_TYPES = {"F32", "F16", "Q4_0", "Q4_1", "Q8_0"}
_GROUP_SIZE = 64  # for weights we quantize ourselves (mlx-lm's default)

# GGUF tensor name -> mlx-lm (Hugging Face) name; "{i}" is the layer.
_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
    "blk.{i}.attn_norm": "model.layers.{i}.input_layernorm",
    "blk.{i}.attn_q": "model.layers.{i}.self_attn.q_proj",
    "blk.{i}.attn_k": "model.layers.{i}.self_attn.k_proj",
    "blk.{i}.attn_v": "model.layers.{i}.self_attn.v_proj",
    "blk.{i}.attn_output": "model.layers.{i}.self_attn.o_proj",
    "blk.{i}.ffn_norm": "model.layers.{i}.post_attention_layernorm",
    "blk.{i}.ffn_gate": "model.layers.{i}.mlp.gate_proj",
    "blk.{i}.ffn_up": "model.layers.{i}.mlp.up_proj",
    "blk.{i}.ffn_down": "model.layers.{i}.mlp.down_proj",
}


def mlx_name(gguf_name: str) -> str:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``."""
    base, _, kind = gguf_name.rpartition(".")
    parts = base.split(".")
    if parts[0] == "blk":
        layer, key = parts[1], "blk.{i}." + ".".join(parts[2:])
    else:
        layer, key = None, base
    if key not in _NAMES:
        raise EdgespecError(f"unexpected tensor {gguf_name} in the GGUF file")
    return _NAMES[key].format(i=layer) + "." + kind


def unpermute_rows(rows, n_head: int):
    """Undo llama.cpp's rope permutation of Q/K rows (works on numpy and MLX arrays).

    The converter wrote ``w.reshape(n_head, 2, d/2, ...).swapaxes(1, 2)``; this
    is its inverse. Quantization groups run along rows, so scales and biases
    are un-permuted the same way.
    """
    shape = rows.shape
    half = shape[0] // n_head // 2
    return rows.reshape(n_head, half, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def gguf_config(reader) -> dict:
    """The mlx-lm ``config.json`` for a GGUF file's hyperparameters."""
    fields = {name: field for name, field in reader.fields.items()}

    def value(key, default=None):
        field = fields.get(key)
        if field is None:
            return default
        part = field.parts[field.data[0]]
        return part.tobytes().decode() if field.types[0].name == "STRING" else part.tolist()[0]

    arch = value("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise EdgespecError(f"the GGUF architecture {arch!r} is not supported on MLX yet "
                            f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)}): use --backend llama.cpp")
    tensors = {t.name: t for t in reader.tensors}
    if "rope_freqs.weight" in tensors:
        raise EdgespecError("this GGUF uses llama-3-style rope scaling (rope_freqs), which the MLX "
                            "conversion does not support yet: use --backend llama.cpp")
    vocab_size = int(tensors["token_embd.weight"].shape[-1])
    hidden = value(f"{arch}.embedding_length")
    heads = value(f"{arch}.attention.head_count")
    return {
        "model_type": arch,
        "hidden_size": hidden,
        "num_hidden_layers": value(f"{arch}.block_count"),
        "intermediate_size": value(f"{arch}.feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": value(f"{arch}.attention.head_count_kv", heads),
        "head_dim": value(f"{arch}.attention.key_length", hidden // heads),
        "rms_norm_eps": value(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": value(f"{arch}.rope.freq_base", 10000.0),
        "max_position_embeddings": value(f"{arch}.context_length", 4096),
        "vocab_size": vocab_size,
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": "blk.0.attn_q.bias" in tensors,
    }


def converted_path(gguf_path: Path, quantize: str) -> Path:
    """Where the converted model of this file (and quantization choice) is cached."""
    stat = gguf_path.stat()
    key = hashlib.sha256(f"{gguf_path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{quantize}".encode())
    return edgespec_home() / "mlx" / f"{gguf_path.stem}-{quantize}-{key.hexdigest()[:12]}"


def convert_gguf(gguf_path: str | os.PathLike, *, quantize: str = "4bit") -> Path:
    """Convert a GGUF file to an mlx-lm model folder (cached); return the folder.

    The folder is built under a temporary name and renamed into place, so a
    crash half-way leaves no folder that looks complete.
    """
    import gguf
    import mlx.core as mx

    if quantize not in QUANTIZE_CHOICES:
        raise EdgespecError(f"invalid MLX quantization {quantize!r}: use one of {', '.join(QUANTIZE_CHOICES)}")
    gguf_path = Path(gguf_path)
    out = converted_path(gguf_path, quantize)
    if (out / "source.json").exists():  # written last, inside the folder before its rename
        return out
    check_gguf_structure(gguf_path)
    try:
        reader = gguf.GGUFReader(str(gguf_path))
    except Exception as exc:
        raise EdgespecError(f"could not read {gguf_path} as GGUF ({exc}): the file is truncated "
                            f"or corrupt; download it again") from None
    config = gguf_config(reader)
    types = {t.tensor_type.name for t in reader.tensors}
    if types <= _DIRECT_TYPES:
        weights, quantization = _load_direct(gguf_path, mx)
    else:
        weights, quantization = _load_dequantized(reader, quantize, gguf, mx)
    if config["model_type"] == "llama":
        kv_heads = config["num_key_value_heads"]
        for name in list(weights):
            if ".self_attn.q_proj." in name:
                weights[name] = unpermute_rows(weights[name], config["num_attention_heads"])
            elif ".self_attn.k_proj." in name:
                weights[name] = unpermute_rows(weights[name], kv_heads)
    if quantization:
        config["quantization"] = quantization
    _remove_abandoned_builds(out)
    building = out.with_name(f".{out.name}.{os.getpid()}.partial")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    try:
        mx.save_safetensors(str(building / "model.safetensors"), weights)
        (building / "config.json").write_text(json.dumps(config, indent=1))
        (building / "source.json").write_text(
            json.dumps({"gguf": str(gguf_path.resolve()), "quantize": quantize}))
        if out.exists():  # an incomplete folder from an older version, or a parallel build
            shutil.rmtree(out, ignore_errors=True)
        os.replace(building, out)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        if (out / "source.json").exists():  # a parallel conversion finished first
            return out
        raise
    return out


def check_gguf_structure(gguf_path: Path) -> None:
    """Let llama.cpp's parser read the file first: it bounds every count by the
    file's size, where the ``gguf`` package would allocate whatever a (hostile)
    header declares, e.g. a metadata array of 2**40 elements."""
    from .gguf_tokenizer import GGUFTokenizer
    GGUFTokenizer.from_file(gguf_path).close()


def _remove_abandoned_builds(out: Path) -> None:
    """Delete half-built folders of ``out`` whose process is gone (a crash, a kill)."""
    for folder in out.parent.glob(f".{out.name}.*.partial"):
        try:
            pid = int(folder.name[len(out.name) + 2:-len(".partial")])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except (ValueError, OSError):
            pass


def _per_layer_quantization(weights: dict, group_size_of) -> dict:
    """mlx-lm's per-layer quantization entries for every quantized weight."""
    quantization: dict = {}
    for name, w in weights.items():
        if name.endswith(".weight") and name[:-len(".weight")] + ".scales" in weights:
            layer = name[:-len(".weight")]
            scales = weights[layer + ".scales"]
            in_features = scales.shape[-1] * group_size_of(layer)
            bits = w.shape[-1] * 32 // in_features
            quantization[layer] = {"group_size": group_size_of(layer), "bits": int(bits)}
    if quantization:
        first = next(iter(quantization.values()))
        quantization = {"group_size": first["group_size"], "bits": first["bits"], **quantization}
    return quantization


def _load_direct(gguf_path: Path, mx):
    """Q4_0/Q4_1/Q8_0/F16/F32 tensors as ``mx.load`` reads them (group size 32)."""
    raw = mx.load(str(gguf_path))
    weights = {mlx_name(name): array for name, array in raw.items()}
    return weights, _per_layer_quantization(weights, lambda layer: 32)


def _load_dequantized(reader, quantize: str, gguf, mx):
    """Every tensor dequantized with ``gguf``, then quantized again with ``mx.quantize``."""
    bits = {"4bit": 4, "8bit": 8, "none": None}[quantize]
    weights = {}
    for tensor in reader.tensors:
        name = mlx_name(tensor.name)
        array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        array = np.asarray(array, dtype=np.float32).reshape([int(d) for d in reversed(tensor.shape)])
        value = mx.array(array)
        if bits and array.ndim == 2 and array.shape[-1] % _GROUP_SIZE == 0:
            wq, scales, biases = mx.quantize(value, group_size=_GROUP_SIZE, bits=bits)
            base = name[:-len(".weight")]
            weights[name], weights[base + ".scales"], weights[base + ".biases"] = wq, scales, biases
        else:
            weights[name] = value.astype(mx.float16) if bits and array.ndim == 2 else value
    return weights, _per_layer_quantization(weights, lambda layer: _GROUP_SIZE)
