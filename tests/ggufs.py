"""Tiny random-weight llama-architecture GGUF models, written with the `gguf` package.

The vocabulary is a SentencePiece-style list of 3 special tokens and a few
letters; tests feed token ids directly. With ``byte_tokens`` the 256 byte
tokens come after the specials, so that any text can be tokenized (llama.cpp
falls back to bytes for what the vocabulary lacks). Weights are float32 so that other
backends (MLX) can reproduce the logits to float32 rounding.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from gguf.quants import quantize

SPECIALS = ["<unk>", "<s>", "</s>"]


def tiny_llama_weights(*, vocab_size: int = 16, n_embd: int = 32, n_layer: int = 2,
                       n_head: int = 4, n_head_kv: int = 2, n_ff: int = 64,
                       seed: int = 0, eos_logit_scale: float = 1.0) -> dict[str, np.ndarray]:
    """Random weights, named as in GGUF, numpy shapes [out, in].

    ``eos_logit_scale`` < 1 shrinks the output row of ``</s>`` (id 2), so that
    greedy generations run long instead of stopping after a few tokens.
    """
    rng = np.random.default_rng(seed)
    head_dim = n_embd // n_head

    def w(*shape, scale=None):
        scale = scale if scale is not None else 1.0 / np.sqrt(shape[-1])
        return (rng.normal(0.0, scale, shape)).astype(np.float32)

    weights = {
        "token_embd.weight": w(vocab_size, n_embd, scale=1.0),
        "output_norm.weight": np.ones(n_embd, np.float32),
        "output.weight": w(vocab_size, n_embd, scale=3.0 / np.sqrt(n_embd)),
    }
    weights["output.weight"][2] *= eos_logit_scale
    for i in range(n_layer):
        p = f"blk.{i}."
        weights.update({
            p + "attn_norm.weight": (1 + 0.1 * rng.normal(size=n_embd)).astype(np.float32),
            p + "attn_q.weight": w(n_embd, n_embd),
            p + "attn_k.weight": w(n_head_kv * head_dim, n_embd),
            p + "attn_v.weight": w(n_head_kv * head_dim, n_embd),
            p + "attn_output.weight": w(n_embd, n_embd),
            p + "ffn_norm.weight": (1 + 0.1 * rng.normal(size=n_embd)).astype(np.float32),
            p + "ffn_gate.weight": w(n_ff, n_embd),
            p + "ffn_up.weight": w(n_ff, n_embd),
            p + "ffn_down.weight": w(n_embd, n_ff),
        })
    return weights


def perturbed(weights: dict[str, np.ndarray], *, scale: float, seed: int) -> dict[str, np.ndarray]:
    """The same model with relative Gaussian noise: a drafter that mostly agrees."""
    rng = np.random.default_rng(seed)
    return {name: (w + scale * w.std() * rng.normal(size=w.shape)).astype(np.float32)
            for name, w in weights.items()}


def write_tiny_llama_gguf(path: str | Path, weights: dict[str, np.ndarray], *,
                          n_head: int = 4, n_head_kv: int = 2, context_length: int = 512,
                          byte_tokens: bool = False, words: list[str] | None = None,
                          chat_template: str | None = None,
                          quantized: dict[str, gguf.GGMLQuantizationType] | None = None) -> Path:
    """Write ``weights`` as an F32 llama GGUF with a small SPM vocabulary
    (``words``: the normal tokens, instead of letters); ``quantized`` names
    tensors to store in a quantized type instead."""
    vocab_size, n_embd = weights["token_embd.weight"].shape
    n_layer = len({k.split(".")[1] for k in weights if k.startswith("blk.")})
    n_ff = weights["blk.0.ffn_up.weight"].shape[0]
    byte_pieces = [f"<0x{b:02X}>" for b in range(256)] if byte_tokens else []
    letters = words or [chr(ord("a") + i % 26) * (1 + i // 26)
                        for i in range(vocab_size - len(SPECIALS) - len(byte_pieces))]
    assert len(SPECIALS) + len(byte_pieces) + len(letters) == vocab_size
    tokens = SPECIALS + byte_pieces + letters
    types = ([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
             + [gguf.TokenType.BYTE] * len(byte_pieces) + [gguf.TokenType.NORMAL] * len(letters))
    path = Path(path)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama")
    writer.add_context_length(context_length)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([-float(i) for i in range(len(tokens))])
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    for name, array in weights.items():
        if quantized and name in quantized:
            writer.add_tensor(name, quantize(array, quantized[name]),
                              raw_dtype=quantized[name])
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def rope_permuted(weights: dict[str, np.ndarray], *, n_head: int = 4, n_head_kv: int = 2
                  ) -> dict[str, np.ndarray]:
    """Hugging Face-order weights as llama.cpp's converter writes them: Q/K rows
    permuted for llama.cpp's rope (``convert_hf_to_gguf.LlamaModel.permute``)."""
    def permute(w, heads):
        return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    out = dict(weights)
    for name, w in weights.items():
        if name.endswith("attn_q.weight"):
            out[name] = permute(w, n_head)
        elif name.endswith("attn_k.weight"):
            out[name] = permute(w, n_head_kv)
    return out


def write_tiny_mlx_model(folder: str | Path, hf_weights: dict[str, np.ndarray], *,
                         n_head: int = 4, n_head_kv: int = 2) -> Path:
    """The same tiny model as an mlx-lm folder, built with mlx-lm's llama classes.

    ``hf_weights`` use GGUF tensor names but Hugging Face row order (no rope
    permutation). A word-level tokenizer over the same tokens is saved with it.
    """
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from edgespec.backends.gguf_mlx import mlx_name

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab_size, n_embd = hf_weights["token_embd.weight"].shape
    config = {
        "model_type": "llama", "hidden_size": int(n_embd),
        "num_hidden_layers": len({k.split(".")[1] for k in hf_weights if k.startswith("blk.")}),
        "intermediate_size": int(hf_weights["blk.0.ffn_up.weight"].shape[0]),
        "num_attention_heads": n_head, "num_key_value_heads": n_head_kv, "rms_norm_eps": 1e-5,
        "vocab_size": int(vocab_size), "rope_theta": 10000.0, "max_position_embeddings": 512,
        "tie_word_embeddings": False,
    }
    model = llama.Model(llama.ModelArgs.from_dict(config))
    model.load_weights([(mlx_name(k), mx.array(v)) for k, v in hf_weights.items()], strict=True)
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (folder / "config.json").write_text(__import__("json").dumps(config))
    tokens = SPECIALS + [chr(ord("a") + i) for i in range(vocab_size - len(SPECIALS))]
    word_level = Tokenizer(models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token="<unk>"))
    word_level.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    PreTrainedTokenizerFast(tokenizer_object=word_level, bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(folder)
    return folder
