"""Weight repacking on llama.cpp: CPU_REPACK without AMX, on a real tiny quantized model."""

import re

import gguf
import numpy as np
import pytest

from edgespec.backends import repack
from edgespec.backends.llama_lib import Log
from edgespec.backends.llamacpp import LlamaCppBackend
from edgespec.drafters import PromptLookup
from edgespec.core.engine import Engine
from edgespec.core.sampling import SamplingParams
from tests.ggufs import tiny_llama_weights, write_tiny_llama_gguf

Q4_0, Q8_0 = gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q8_0
MATMULS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


@pytest.fixture(scope="module")
def q4_model(tmp_path_factory):
    """A 3-layer model whose matmul weights are Q4_0, except layer 1's attn_k (Q8_0,
    which CPU_REPACK does not take on x86); embeddings and norms stay F32."""
    weights = tiny_llama_weights(vocab_size=64, n_embd=64, n_layer=3, n_ff=128, seed=5,
                                 eos_logit_scale=0.3)
    quantized = {f"blk.{i}.{m}.weight": Q4_0 for i in range(3) for m in MATMULS}
    quantized["blk.1.attn_k.weight"] = Q8_0
    quantized["output.weight"] = Q4_0
    return write_tiny_llama_gguf(tmp_path_factory.mktemp("q4") / "q4.gguf", weights,
                                 quantized=quantized)


def test_repackable_tensors_are_the_matmul_weights_of_types_it_takes(q4_model):
    names = repack.repackable_tensors(q4_model)
    expected = {f"blk.{i}.{m}.weight" for i in range(3) for m in MATMULS} | {"output.weight"}
    assert set(names) == expected - {"blk.1.attn_k.weight"}
    # One pattern for llama.cpp that matches exactly those (Python's re reads it alike).
    pattern = re.compile(repack.tensor_pattern(names))
    all_names = [t.name for t in gguf.GGUFReader(str(q4_model)).tensors]
    assert {n for n in all_names if pattern.search(n)} == set(names)


def test_an_f32_model_has_nothing_to_repack(tmp_path):
    path = write_tiny_llama_gguf(tmp_path / "f32.gguf", tiny_llama_weights())
    assert repack.repackable_tensors(path) == []
    assert repack.cpu_repack_overrides(path) is None


def test_the_mode_follows_the_cpu_and_the_environment(monkeypatch):
    for value, mode in (("0", "off"), ("1", "all"), ("cpu", "cpu")):
        monkeypatch.setenv("EDGESPEC_LLAMA_REPACK", value)
        assert repack.repack_mode() == mode
        assert repack.use_extra_buffer_types() == (mode == "all")
    monkeypatch.delenv("EDGESPEC_LLAMA_REPACK")
    monkeypatch.setattr(repack, "_has_amx", lambda: True)
    assert repack.repack_mode() == "cpu"
    monkeypatch.setattr(repack, "_has_amx", lambda: False)
    assert repack.repack_mode() == "all"


def load(path, mode, monkeypatch):
    """The model loaded with repacking ``mode``, and llama.cpp's buffer lines while loading."""
    monkeypatch.setenv("EDGESPEC_LLAMA_REPACK", mode)
    lines = []
    monkeypatch.setattr(Log, "listener", lines.append)
    backend = LlamaCppBackend(path, n_ctx=256)
    monkeypatch.setattr(Log, "listener", None)
    return backend, [line for line in lines if "buffer size" in line]


@pytest.mark.skipif(repack._cpu_repack() is None or not repack._cpu_repack().avx2,
                    reason="this llama.cpp or CPU has no CPU_REPACK layout for Q4_0 (x86 with AVX2)")
def test_cpu_repack_only_puts_the_weights_there_and_decodes_the_same(q4_model, monkeypatch):
    plain, plain_buffers = load(q4_model, "0", monkeypatch)
    packed, packed_buffers = load(q4_model, "cpu", monkeypatch)
    try:
        assert not any("CPU_REPACK" in line for line in plain_buffers)
        assert any("CPU_REPACK" in line for line in packed_buffers), packed_buffers
        assert not any("AMX" in line for line in packed_buffers)
        tokens = [int(t) for t in np.random.default_rng(0).integers(3, 64, size=24)]
        # The same logits as the unpacked model, one row at a time and in a batched
        # pass (the kernels differ: rounding only, far below the logits' spread).
        reference = plain.forward(tokens)
        batched = packed.forward(tokens)
        packed.rewind(0)
        single = np.stack([packed.forward([t])[-1] for t in tokens])
        spread = reference.std()
        for logits in (batched, single):
            assert np.abs(logits - reference).max() < 0.05 * spread
        # And speculative decoding over the packed model commits what plain greedy does.
        params = SamplingParams(temperature=0.0)
        prompt = tokens[:8] * 3
        engine = Engine(packed, PromptLookup(min_ngram=1, max_ngram=3), num_draft=4)
        want = engine.generate(prompt, params, max_tokens=60, speculative=False)
        got = engine.generate(prompt, params, max_tokens=60)
        assert got.token_ids == want.token_ids and got.stats.accepted > 0
    finally:
        plain.close()
        packed.close()
