"""The llama.cpp backend on real llama.cpp: tiny random GGUF files and SmolLM2-135M."""

import numpy as np
import pytest

from edgespec import DraftModel, EdgespecError, Engine, PromptLookup, SamplingParams
from edgespec.backends.llamacpp import LlamaCppBackend
from edgespec.planner.costs import CostModel
from edgespec.planner import AdaptivePlanner, AutoPlanners, auto_drafters
from edgespec.core.prompting import chat_prompt_ids
from exactness import assert_pair_samples_target
from greedy import assert_equal_up_to_a_near_tie

GREEDY = SamplingParams(temperature=0)


def test_rewind_then_forward_reproduces_the_logits(tiny_gguf_pair):
    backend = LlamaCppBackend(tiny_gguf_pair[0], n_ctx=128)
    tokens = [1, 5, 9, 3, 7, 12, 4]
    full = backend.forward(tokens)  # [7, V]
    assert full.shape == (7, 16) and backend.n_past == 7
    backend.rewind(3)
    assert backend.n_past == 3
    again = backend.forward(tokens[3:])
    np.testing.assert_allclose(again, full[3:], rtol=0, atol=1e-5)
    # last_only returns just the final row.
    backend.rewind(3)
    np.testing.assert_allclose(backend.forward(tokens[3:], last_only=True)[0], full[-1], atol=1e-5)


def test_real_model_rewind_then_forward(smollm2_path):
    backend = LlamaCppBackend(smollm2_path, n_ctx=256)
    ids = backend.tokenize("The quick brown fox jumps over the lazy dog", add_bos=False)
    full = backend.forward(ids)
    backend.rewind(4)
    again = backend.forward(ids[4:])
    # Same positions, same cache: batch kernels may round differently in the last bits.
    np.testing.assert_allclose(again, full[4:], rtol=0, atol=1e-3)
    assert (again.argmax(-1) == full[4:].argmax(-1)).all()


def test_vocabulary_and_template_come_from_the_gguf(smollm2_path):
    backend = LlamaCppBackend(smollm2_path, n_ctx=256)
    assert backend.vocab.size == 49152 and backend.vocab.kind == "bpe"
    im_end = backend.tokenize("<|im_end|>", add_bos=False, special=True)
    assert len(im_end) == 1 and im_end[0] in backend.vocab.eos_token_ids
    ids = chat_prompt_ids(backend, [{"role": "user", "content": "Hi"}])
    text = b"".join(backend.token_bytes(t) for t in ids).decode()
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("drafter", ["draft-model", "lookup"])
def test_greedy_speculative_equals_plain_on_tiny_models(tiny_gguf_pair, drafter):
    target = LlamaCppBackend(tiny_gguf_pair[0], n_ctx=256)
    draft = DraftModel(LlamaCppBackend(tiny_gguf_pair[1], n_ctx=256)) if drafter == "draft-model" \
        else PromptLookup(min_ngram=1, max_ngram=3)
    engine = Engine(target, draft, num_draft=4)
    prompt = [1, 4, 5, 6, 4, 5]
    plain = engine.generate(prompt, GREEDY, max_tokens=100, speculative=False)
    spec = engine.generate(prompt, GREEDY, max_tokens=100)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.accepted > 0


def test_switching_a_live_engine_to_auto_keeps_its_caches_true(tiny_gguf_pair, tmp_path, monkeypatch):
    """With no cached costs for the pair, switching to auto mode calibrates it: passes
    on both models, after which their caches no longer hold the conversation. The
    engine must not go on as if they did (it answered another question)."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))  # no calibration cached
    target = LlamaCppBackend(tiny_gguf_pair[0], n_ctx=256)
    drafter = DraftModel(LlamaCppBackend(tiny_gguf_pair[1], n_ctx=256))
    engine = Engine(target, drafter, num_draft=2, planners=AutoPlanners())
    prompt = [1, 4, 5, 6, 4, 5, 7, 8, 9, 4, 5, 6]
    before = engine.generate(prompt, GREEDY, max_tokens=40)
    engine.configure(drafter, "auto")
    assert list((tmp_path / "calibration").glob("*.json"))  # it did calibrate
    for speculative in (False, True):
        after = engine.generate(prompt, GREEDY, max_tokens=40, speculative=speculative)
        assert after.token_ids == before.token_ids


class PinnedCosts(CostModel):
    """Costs fixed at what a batched pass costs on a GPU (a 9-token pass: 1.8 steps; a
    draft model step: 0.3), whatever this machine's timing. Auto mode's decisions then
    rest on the text alone. On measured costs they rest on the CPU too: a 135M model's
    passes cost nearly n steps there, and on CI's machine a rejected first probe kept
    auto mode off for a whole answer, so the test asserted nothing about auto's output.
    Whether auto mode decides well from measured costs is test_planner's job."""

    def v(self, n: int) -> float:
        return 1.0 + 0.1 * (max(n, 1) - 1)

    def c(self, name: str) -> float:
        return 0.0 if name == "lookup" else 0.3


@pytest.mark.parametrize("drafter", ["draft-model", "lookup", "auto"])
def test_greedy_speculative_equals_plain_on_smollm2(smollm2_path, smollm2_q2k_path, drafter):
    target = LlamaCppBackend(smollm2_path, n_ctx=1024)
    draft = PromptLookup() if drafter == "lookup" else \
        DraftModel(LlamaCppBackend(smollm2_q2k_path, n_ctx=1024), min_confidence=0.8)
    if drafter == "auto":  # both drafters on offer, as edgespec.load sets it up
        planner = AdaptivePlanner(auto_drafters(draft, PromptLookup(max_ngram=8)), PinnedCosts())
        engine = Engine(target, draft, num_draft="auto", planner=planner)
    else:
        engine = Engine(target, draft, num_draft=4)
    # An answer that copies from the prompt, ~100 tokens long: prompt lookup pays here.
    prompt = chat_prompt_ids(target, [{"role": "user", "content":
                                       "Copy this Python code exactly:\n\n"
                                       "def area(width, height):\n    return width * height\n\n"
                                       "def perimeter(width, height):\n    return 2 * (width + height)\n\n"
                                       "def diagonal(width, height):\n"
                                       "    return (width ** 2 + height ** 2) ** 0.5\n\n"
                                       "def is_square(width, height):\n    return width == height\n"}])
    plain = engine.generate(prompt, GREEDY, max_tokens=128, speculative=False)
    spec = engine.generate(prompt, GREEDY, max_tokens=128)
    s = spec.stats
    assert sum(s.rounds_per_drafter.values()) == s.rounds
    assert s.accepted > 0 and s.rounds + s.plain_steps < s.generated_tokens
    if drafter == "auto":  # the output holds while auto mode switches between drafters
        assert set(s.rounds_per_drafter) == {"lookup", draft.name}
    assert_equal_up_to_a_near_tie(engine, prompt, plain.token_ids, spec.token_ids)


def test_statistical_exactness_on_llamacpp(tiny_gguf_pair):
    """Speculative samples through llama.cpp match the target exactly (chi-square, 0.001)."""
    assert_pair_samples_target(LlamaCppBackend(tiny_gguf_pair[0], n_ctx=64),
                               LlamaCppBackend(tiny_gguf_pair[1], n_ctx=64),
                               SamplingParams(temperature=1.0, top_k=6), 6000, seed=21)


def test_incompatible_drafter_is_refused_with_reasons(tiny_gguf_pair, smollm2_path):
    target = LlamaCppBackend(smollm2_path, n_ctx=64)
    other = LlamaCppBackend(tiny_gguf_pair[1], n_ctx=64)
    with pytest.raises(EdgespecError) as err:
        Engine(target, DraftModel(other))
    message = str(err.value)
    assert "draft vocab 16 != target vocab 49152" in message
    assert "vocabulary type differs" in message and "pair check" in message


def test_context_overflow_during_generation_finishes_cleanly(smollm2_path):
    target = LlamaCppBackend(smollm2_path, n_ctx=64)  # llama.cpp rounds it up (to 256)
    engine = Engine(target, PromptLookup(), num_draft=4)
    prompt = target.tokenize("one two three four five six seven eight nine ten", add_bos=False)
    g = engine.generate(prompt, GREEDY, max_tokens=10_000)
    assert g.finish_reason == "length" and len(prompt) + len(g.token_ids) == target.n_ctx
    # The engine is still usable after filling the context.
    assert engine.generate(prompt, GREEDY, max_tokens=3).token_ids == g.token_ids[:3]
