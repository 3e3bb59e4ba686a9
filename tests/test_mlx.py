"""The MLX backend (CPU here, Metal on Apple Silicon) against llama.cpp on the same weights."""

import numpy as np
import pytest

from edgespec import DraftModel, Engine, PromptLookup, SamplingParams
from edgespec.backends.llamacpp import LlamaCppBackend
from edgespec.models.loading import BackendOptions, load_backend
from edgespec.core.prompting import chat_prompt_ids
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


def test_prompt_lookup_reproduces_plain_sampling_on_mlx(tiny_model_files):
    """Verified on the device, a deterministic drafter's round samples each row with
    the key a plain step there would use, and leaves the generator where plain
    sampling would: the same seed gives the same tokens."""
    engine = Engine(mlx(tiny_model_files[1]), PromptLookup(min_ngram=1), num_draft=3)
    prompt, params = [1, 4, 5, 6, 4, 5], SamplingParams(temperature=0.7, seed=5)
    plain = engine.generate(prompt, params, max_tokens=60, speculative=False)
    spec = engine.generate(prompt, params, max_tokens=60)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.accepted > 0 and spec.stats.plain_steps < 60


@pytest.fixture(scope="module")
def exactness_pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pair")
    weights = tiny_llama_weights(seed=0)
    return (write_tiny_llama_gguf(folder / "target.gguf", weights),
            write_tiny_llama_gguf(folder / "draft.gguf", perturbed(weights, scale=0.3, seed=1)))


# MLX drafting for MLX with a confidence stop (0.4) covers the MLX-only pair in the
# default run; without the stop it runs with -m slow (30 s each on a 2-core CPU).
@pytest.mark.parametrize("target_backend, draft_backend, p_min", [
    # (the default suite keeps the MLX target; MLX drafting runs there in the host-sync
    # test below, and its chi-square with -m slow)
    pytest.param("mlx", "mlx", 0.0, marks=pytest.mark.slow),
    pytest.param("llama.cpp", "mlx", 0.0, marks=pytest.mark.slow),
    ("mlx", "llama.cpp", 0.0),
    pytest.param("mlx", "mlx", 0.4, marks=pytest.mark.slow)])
def test_statistical_exactness_with_mlx(exactness_pair, target_backend, draft_backend, p_min):
    """Chi-square at significance 0.001, fixed seed, 3000 samples of 3 tokens; with
    ``p_min`` the draft model stops below that confidence (on MLX: decided on the
    host after the device drafted all k)."""
    target_path, draft_path = exactness_pair
    make = {"mlx": lambda p: mlx(p, 64), "llama.cpp": lambda p: LlamaCppBackend(p, n_ctx=64)}
    target = make[target_backend](target_path)
    params = SamplingParams(temperature=1.0, top_k=6)
    prompt = [1, 4, 5, 6]
    expected = exact_distribution(target, prompt, params, 3)
    drafter = DraftModel(make[draft_backend](draft_path), min_confidence=p_min)
    engine = Engine(target, drafter, num_draft=2)
    counts, totals = sample_continuations(engine, prompt, params, 3, 3000, seed=31)
    assert 0 < totals.accepted < totals.drafted
    assert chi_square_pvalue(counts, expected) > SIGNIFICANCE


SMOLLM_PROMPTS = ["What is the capital of France?", "Write a haiku about autumn.",
                  "Explain what a CPU does in one paragraph.", "List three primary colors.",
                  "What is 2 + 2?", "Give me a tip for learning to code."]
# llama.cpp multiplies Q4_1 weights with activations quantized to Q8_1, MLX with float
# activations: logits differ by up to ~1 (of ~25) on SmolLM2. Measured on the dequantized
# (F16) weights the two agree to 0.06, so the conversion is exact and the gap is the kernels'.
BACKENDS_APART = 1.0  # (two backends' kernels: not the near-tie of one backend's passes)
STOP = -1  # stands for "stopped at an end token" in a greedy path


def greedy_path(engine, ids):
    """The greedy continuation as events: its tokens, then STOP if an end token ended it."""
    g = engine.generate(ids, GREEDY, max_tokens=32)
    return g.token_ids + ([STOP] if g.finish_reason == "stop" else [])


def path_logits(backend, ids, path):
    """The backend's logits before each event of ``path``, all evaluated on the path."""
    backend.rewind(0)
    rows = [backend.forward(ids, last_only=True)[-1]]
    tokens = [t for t in path if t != STOP]
    if tokens:
        rows.extend(backend.forward(tokens))
    return rows[:len(path)]


def gap_to_best(logits, event, eos):
    """How far ``event`` (a token, or STOP: the best end token) is from the best logit."""
    value = max(logits[t] for t in eos) if event == STOP else logits[event]
    return float(logits.max() - value)


def top2_gap(logits):
    top = np.partition(logits, -2)[-2:]
    return float(top[1] - top[0])


@pytest.fixture(scope="module")
def smollm2_on_both(smollm2_path):
    return LlamaCppBackend(smollm2_path, n_ctx=512), mlx(smollm2_path, 512)


# With -m slow (about 20 s of MLX on a 2-core CPU per prompt).
@pytest.mark.slow
@pytest.mark.parametrize("prompt", SMOLLM_PROMPTS)
def test_smollm2_q4_1_greedy_agrees_across_backends_up_to_near_ties(smollm2_on_both, prompt):
    """The same Q4_1 file on both backends: greedy choices (32 tokens) agree wherever
    llama.cpp (the reference) has no near-tie between its two best tokens. Checked at
    every position of the reference's greedy path (both backends fed the same tokens),
    and on MLX's own greedy continuation: identical up to where the two first differ,
    which is a near-tie between the two tokens on both backends."""
    on_llamacpp, on_mlx = smollm2_on_both
    eos = on_llamacpp.vocab.eos_token_ids
    assert eos == on_mlx.vocab.eos_token_ids
    ids = chat_prompt_ids(on_llamacpp, [{"role": "user", "content": prompt}])
    assert ids == chat_prompt_ids(on_mlx, [{"role": "user", "content": prompt}])
    a = greedy_path(Engine(on_llamacpp), ids)
    b = greedy_path(Engine(on_mlx), ids)
    assert len(a) > 1, (prompt, a)  # a reply to compare, not an immediate stop
    reference = path_logits(on_llamacpp, ids, a)
    on_path = path_logits(on_mlx, ids, a)  # MLX's logits on the same contexts
    clear = [top2_gap(row) >= BACKENDS_APART for row in reference]
    assert any(clear), prompt  # some choices are unambiguous, so the check has teeth
    # Re-evaluated, the reference picks its own path where it is not near a tie.
    assert all(gap_to_best(reference[i], e, eos) == 0.0 for i, e in enumerate(a) if clear[i]), prompt
    # Where MLX's greedy choice differs from the reference's, the reference had a
    # near-tie, and MLX sees the reference's token within BACKENDS_APART of its best too.
    disagreed = [(i, top2_gap(reference[i]), gap_to_best(on_path[i], e, eos))
                 for i, e in enumerate(a) if gap_to_best(on_path[i], e, eos) > 0.0]
    assert all(not clear[i] and mlx_gap < BACKENDS_APART for i, _, mlx_gap in disagreed), \
        (prompt, disagreed)
    # MLX's own continuation: identical to the reference up to the first difference,
    # which must be a near-tie between the two tokens, on both backends.
    first = next((i for i in range(max(len(a), len(b)))
                  if i >= len(a) or i >= len(b) or a[i] != b[i]), None)
    if first is None:
        return
    # Both continuations hold an event there (a path ends with STOP or at 32 tokens).
    assert first < min(len(a), len(b)), (prompt, a, b)
    assert not clear[first], (prompt, first, a[first], b[first])
    for name, logits in (("llama.cpp", reference[first]), ("mlx", on_path[first])):
        gaps = [gap_to_best(logits, e, eos) for e in (a[first], b[first])]
        assert max(gaps) < BACKENDS_APART, (prompt, first, name, gaps)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_mlx_drafts_and_verifies_with_one_host_sync_each_per_round(exactness_pair, temperature):
    """On MLX the draft loop (k forwards, each fed the token sampled on the device)
    and the verification each evaluate once: two host synchronizations a round."""
    from edgespec.backends import mlx_ops
    target_path, draft_path = exactness_pair
    engine = Engine(mlx(target_path, 128), DraftModel(mlx(draft_path, 128)), num_draft=4)
    before = mlx_ops.host_syncs
    stats = engine.generate([1, 4, 5, 6], SamplingParams(temperature=temperature, seed=5),
                            max_tokens=40).stats
    assert stats.rounds > 5 and stats.drafted_per_position[:1] == [stats.rounds]
    # A plain step (the last token, with no room left to draft) verifies alone.
    assert mlx_ops.host_syncs - before == 2 * stats.rounds + stats.plain_steps


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.7), SamplingParams(temperature=1.2, top_k=40),
    SamplingParams(temperature=0.9, top_p=0.8), SamplingParams(temperature=1.0, min_p=0.05),
    SamplingParams(temperature=0.8, typical_p=0.7),
    SamplingParams(temperature=0.6, top_k=50, typical_p=0.9, top_p=0.9, temperature_last=True),
    SamplingParams(temperature=0)])
def test_device_probabilities_equal_the_host_ones(params):
    import mlx.core as mx

    from edgespec import logits_to_probs
    logits = np.random.default_rng(2).normal(0, 3, (3, 4000)).astype(np.float32)
    np.testing.assert_allclose(np.array(logits_to_probs(mx.array(logits), params)),
                               logits_to_probs(logits, params), rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("params, kept", [
    (SamplingParams(temperature=0), [[1], [0]]),
    (SamplingParams(temperature=1.0, top_k=2), [[1, 3, 4], [0, 1]]),
    (SamplingParams(temperature=1.0, top_p=0.3), [[1, 3, 4], [0, 1]]),
    (SamplingParams(temperature=1.0, min_p=0.5), [[1, 2, 3, 4, 5, 7], [0, 1]])])
def test_host_and_device_break_ties_alike(params, kept):
    """Exact ties: the argmax is the first of the tied ids, and a filter keeps every
    token tied with the last one it keeps, on the host and on the device."""
    import mlx.core as mx

    from edgespec import logits_to_probs
    logits = np.log(np.array([[1, 4, 2, 4, 4, 2, 1, 2], [3, 3, 1, 1, 1, 1, 1, 1]], np.float32))
    host = logits_to_probs(logits, params)
    device = np.array(logits_to_probs(mx.array(logits), params))
    assert [np.flatnonzero(row).tolist() for row in host] == kept
    assert [np.flatnonzero(row).tolist() for row in device] == kept
    np.testing.assert_allclose(device, host, rtol=1e-6)


@pytest.mark.parametrize("invariant", [False, True])
def test_device_and_host_verdicts_agree_where_no_draw_decides(invariant):
    """Greedy rounds, and seed-invariant ones (the race decides): verified on the device
    and on the host, the same verdicts and top probabilities, with or without a
    draft's q, with k + 1 rows or k (the last draft an id the target lacks)."""
    import mlx.core as mx

    from edgespec import logits_to_probs
    from edgespec.backends.mlx_ops import verify_on_device
    from edgespec.core.acceptance import verify_round
    from edgespec.core.coupling import Coupling
    rng = np.random.default_rng(4)
    vocab, rounds = 3000, 0
    params = SamplingParams(temperature=0.8, top_k=50, seed=3) if invariant else GREEDY
    for trial in range(40):
        k = int(rng.integers(0, 5))
        logits = rng.normal(0, 2.0, (k + 1, vocab)).astype(np.float32)
        coupling = Coupling(int(rng.integers(1 << 30)))
        own = coupling.picks(logits_to_probs(logits, params), trial) if invariant else logits.argmax(-1)
        drafts = [int(own[i]) if rng.random() < 0.8 else int(rng.integers(vocab)) for i in range(k)]
        if k and trial % 3 == 0:  # the last draft outside the target's vocabulary: k rows
            drafts[-1], logits = vocab + 1, logits[:k]
        q = None if trial % 2 else rng.dirichlet(np.ones(vocab + 2), k).astype(np.float32)
        host, host_top = verify_round(logits, drafts, q, params, coupling, position=trial)
        device, device_top = verify_on_device(mx.array(logits), drafts, q, params, coupling,
                                              position=trial)
        assert device == host
        np.testing.assert_allclose(device_top, host_top, rtol=1e-5)
        rounds += host.num_accepted > 0
    assert rounds > 5


@pytest.mark.parametrize("with_q", [True, False])
def test_device_and_host_rules_give_one_distribution(with_q):
    """Sampled rounds (the exact rule, a draft model's q or a deterministic drafter's):
    what the device commits first is distributed as p itself, and as the host's."""
    import mlx.core as mx
    from collections import Counter

    from edgespec.backends.mlx_ops import verify_on_device
    from edgespec.core.acceptance import verify_round
    params = SamplingParams(temperature=1.0)
    logits = np.log(np.array([[0.05, 0.4, 0.3, 0.2, 0.05], [0.3, 0.3, 0.2, 0.1, 0.1]], np.float32))
    q = np.array([[0.5, 0.1, 0.1, 0.2, 0.1]], np.float32) if with_q else None
    p0 = np.exp(logits[0]) / np.exp(logits[0]).sum()
    samples = 3000
    for side, verify, rows in (("device", verify_on_device, mx.array(logits)), ("host", verify_round, logits)):
        rng = np.random.default_rng(8)
        # A draft model's draft is drawn from its q; a deterministic drafter's is any token.
        drafts = rng.choice(5, samples, p=q[0]) if with_q else np.zeros(samples, int)
        counts = Counter(verify(rows, [int(x)], q, params, rng)[0].token_ids[0] for x in drafts)
        expected = {(t,): float(p) for t, p in enumerate(p0)}
        assert chi_square_pvalue(Counter({(t,): c for t, c in counts.items()}), expected) > SIGNIFICANCE, \
            (side, counts)


def test_device_draft_loop_leaves_the_cache_as_the_host_loop_does(exactness_pair):
    """Greedy drafts with a confidence stop, on the device and on the host: the same
    drafts, and the draft cache holds the context and every draft but the last
    (all of them after a stop) either way."""
    _, draft_path = exactness_pair
    on_device = DraftModel(mlx(draft_path, 128), min_confidence=0.35)
    on_host = DraftModel(mlx(draft_path, 128), min_confidence=0.35)
    on_host.backend.device_logits = False  # the numpy loop, on the same weights
    rng = np.random.default_rng(0)
    stops = 0
    for start in range(12):
        context = [1, 4, 5, 6, 7, 2][: 2 + start % 4] + [start + 3] * (start % 3)
        drafts = []
        for drafter in (on_device, on_host):
            drafter.reset()
            drafter.prefill(context)
            draft = drafter.propose(context, 4, GREEDY, rng)
            kept = len(draft)
            assert drafter.cache.tokens == context + draft.token_ids[:min(kept, 3)]
            assert drafter.backend.n_past == len(drafter.cache.tokens)
            drafts.append(draft.token_ids)
        assert drafts[0] == drafts[1]
        stops += len(drafts[0]) < 4
    assert 0 < stops < 12  # both a stop and a full draft happened
