"""The MLX backend (CPU here, Metal on Apple Silicon) against llama.cpp on the same weights."""

import numpy as np
import pytest

from edgespec import DraftModel, Engine, PromptLookup, SamplingParams
from edgespec.backends.llamacpp import LlamaCppBackend
from edgespec.loading import BackendOptions, load_backend
from edgespec.prompting import chat_prompt_ids
from exactness import SIGNIFICANCE, chi_square_pvalue, exact_distribution, sample_continuations
from ggufs import perturbed, rope_permuted, tiny_llama_weights, write_tiny_llama_gguf, write_tiny_mlx_model

GREEDY = SamplingParams(temperature=0)
# Observed max |difference| of logits between the two backends: 3e-6 on logits of
# magnitude ~8, i.e. float32 rounding. The tolerance leaves room for other BLAS kernels.
FLOAT32_ATOL = 1e-4


@pytest.fixture(autouse=True)
def private_home(tmp_path_factory, monkeypatch):
    # Converted models are cached under EDGESPEC_HOME; keep the tests' own.
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path_factory.getbasetemp() / "edgespec-home"))


@pytest.fixture(scope="module")
def tiny_model_files(tmp_path_factory):
    """One tiny llama model as an F32 GGUF (rope-permuted Q/K, as llama.cpp's converter
    writes it) and as an mlx-lm folder written with mlx-lm's classes."""
    folder = tmp_path_factory.mktemp("tiny-both")
    hf_weights = tiny_llama_weights(seed=3, eos_logit_scale=0.0)
    gguf = write_tiny_llama_gguf(folder / "tiny.gguf", rope_permuted(hf_weights))
    mlx_dir = write_tiny_mlx_model(folder / "tiny-mlx", hf_weights)
    return gguf, mlx_dir


def mlx(spec, n_ctx=256):
    return load_backend(str(spec), BackendOptions(backend="mlx", n_ctx=n_ctx))


def exact_llamacpp(path, n_ctx=256):
    # f32 KV cache and no flash attention: llama.cpp's f16 paths would differ by ~1e-3.
    return LlamaCppBackend(path, n_ctx=n_ctx, kv_cache_type="f32", flash_attn=False)


def test_logits_agree_to_float32_rounding(tiny_model_files):
    gguf, mlx_dir = tiny_model_files
    tokens = [1, 5, 9, 3, 7, 12, 4, 4, 8]
    reference = exact_llamacpp(gguf).forward(tokens)
    for backend in (mlx(mlx_dir), mlx(gguf)):  # the mlx-lm folder, and the GGUF converted
        logits = backend.forward(tokens)
        np.testing.assert_allclose(logits, reference, rtol=0, atol=FLOAT32_ATOL)


def test_identical_greedy_generations(tiny_model_files):
    gguf, mlx_dir = tiny_model_files
    prompt = [1, 4, 5, 6]
    outputs = [Engine(b).generate(prompt, GREEDY, max_tokens=40).token_ids
               for b in (exact_llamacpp(gguf), mlx(mlx_dir), mlx(gguf))]
    assert outputs[0] == outputs[1] == outputs[2]
    assert len(outputs[0]) == 40


def test_rewind_then_forward_on_mlx(tiny_model_files):
    backend = mlx(tiny_model_files[1])
    tokens = [1, 5, 9, 3, 7, 12, 4]
    full = backend.forward(tokens)
    backend.rewind(2)
    assert backend.n_past == 2
    np.testing.assert_allclose(backend.forward(tokens[2:]), full[2:], atol=1e-5)


def test_greedy_speculative_equals_plain_on_mlx(tiny_model_files, tmp_path):
    gguf, mlx_dir = tiny_model_files
    draft_gguf = write_tiny_llama_gguf(tmp_path / "draft.gguf",
                                       rope_permuted(perturbed(tiny_llama_weights(seed=3, eos_logit_scale=0.0),
                                                               scale=0.3, seed=4)))
    for drafter in (DraftModel(mlx(draft_gguf)), PromptLookup(min_ngram=1)):
        engine = Engine(mlx(mlx_dir), drafter, num_draft=3)
        prompt = [1, 4, 5, 6, 4, 5]
        assert engine.generate(prompt, GREEDY, max_tokens=60).token_ids == \
            engine.generate(prompt, GREEDY, max_tokens=60, speculative=False).token_ids


@pytest.fixture(scope="module")
def exactness_pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pair")
    weights = tiny_llama_weights(seed=0)
    return (write_tiny_llama_gguf(folder / "target.gguf", weights),
            write_tiny_llama_gguf(folder / "draft.gguf", perturbed(weights, scale=0.3, seed=1)))


@pytest.mark.parametrize("target_backend, draft_backend", [
    ("mlx", "mlx"), ("llama.cpp", "mlx"), ("mlx", "llama.cpp")])
def test_statistical_exactness_with_mlx(exactness_pair, target_backend, draft_backend):
    """Chi-square at significance 0.001, fixed seed, 3000 samples of 3 tokens."""
    target_path, draft_path = exactness_pair
    make = {"mlx": lambda p: mlx(p, 64), "llama.cpp": lambda p: LlamaCppBackend(p, n_ctx=64)}
    target = make[target_backend](target_path)
    params = SamplingParams(temperature=1.0, top_k=6)
    prompt = [1, 4, 5, 6]
    expected = exact_distribution(target, prompt, params, 3)
    engine = Engine(target, DraftModel(make[draft_backend](draft_path)), num_draft=2)
    counts, totals = sample_continuations(engine, prompt, params, 3, 3000, seed=31)
    assert 0 < totals.accepted < totals.drafted
    assert chi_square_pvalue(counts, expected) > SIGNIFICANCE


SMOLLM_PROMPTS = ["What is the capital of France?", "Write a haiku about autumn.",
                  "Explain what a CPU does in one paragraph.", "List three primary colors.",
                  "What is 2 + 2?", "Give me a tip for learning to code."]
# llama.cpp multiplies Q4_1 weights with activations quantized to Q8_1, MLX with float
# activations: logits differ by up to ~1 (of ~25) on SmolLM2. Measured on the dequantized
# (F16) weights the two agree to 0.06, so the conversion is exact and the gap is the kernels'.
NEAR_TIE = 1.0


def test_smollm2_q4_1_greedy_agrees_across_backends_up_to_near_ties(smollm2_path):
    """The same Q4_1 file on both backends: greedy continuations (32 tokens) are
    identical, or first differ where both backends see a near-tie between the two tokens."""
    on_llamacpp = LlamaCppBackend(smollm2_path, n_ctx=512)
    on_mlx = mlx(smollm2_path, 512)
    agreed = []
    for prompt in SMOLLM_PROMPTS:
        ids = chat_prompt_ids(on_llamacpp, [{"role": "user", "content": prompt}])
        assert ids == chat_prompt_ids(on_mlx, [{"role": "user", "content": prompt}])
        a = Engine(on_llamacpp).generate(ids, GREEDY, max_tokens=32).token_ids
        b = Engine(on_mlx).generate(ids, GREEDY, max_tokens=32).token_ids
        agree = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if agree is None:
            assert len(a) == len(b)  # both ran to 32 tokens or stopped together
            agreed.append(len(a))
            continue
        agreed.append(agree)
        context = ids + a[:agree]
        for backend in (on_llamacpp, on_mlx):
            backend.rewind(0)
            logits = backend.forward(context, last_only=True)[-1]
            # Both backends' choices are within the kernels' error of the best logit.
            gaps = [float(logits.max() - logits[t]) for t in (a[agree], b[agree])]
            assert max(gaps) < NEAR_TIE, (prompt, agree, backend.name, gaps)
