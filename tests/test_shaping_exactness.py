"""A request's logit bias, penalties and grammar keep speculative decoding exact.

The exact distribution of three-token continuations under the shaped target is
enumerated (the shaping applied at every prefix, as plain decoding applies it),
and samples through the engine, drafting, are compared with it by a chi-square
test at significance 0.001 (exactness.SIGNIFICANCE), with fixed seeds. A broken
variant, penalties counted from the committed text only (not the round's earlier
drafts), must fail the same test.
"""

from collections import Counter

import numpy as np
import pytest

from edgespec import DraftModel, Engine, PromptLookup, SamplingParams
from edgespec.backends.llamacpp import LlamaCppBackend
from edgespec.backends.toy import ToyBackend
from edgespec.core.grammar import Grammar
from edgespec.core.prompting import chat_prompt_ids
from edgespec.core.shaping import Shaping
from exactness import SIGNIFICANCE, chi_square_pvalue, exact_distribution
from ggufs import perturbed, tiny_llama_weights, write_tiny_llama_gguf
from greedy import assert_equal_up_to_a_near_tie

pytest.importorskip("llguidance")

VOCAB, EOS, LENGTH = 8, 7, 3
PROMPT = [0, 1, 2, 0, 1]


def penalties() -> Shaping:
    return Shaping(presence_penalty=1.0, frequency_penalty=2.0)


def repeats() -> Shaping:  # llama.cpp's penalty over a window of 3, the prompt's tokens in it
    return Shaping(repeat_penalty=1.8, repeat_last_n=3)


def biased() -> Shaping:
    return Shaping(logit_bias={3: 4.0, 4: -100.0}, frequency_penalty=1.5)


REGEX = None


def grammar() -> Shaping:  # "a" or "bc", then letters a..f; the end token only when complete
    global REGEX
    REGEX = REGEX or Grammar.regex("(a|bc)[a-f]*")  # (one grammar, started afresh per reply)
    return Shaping(rule=REGEX)


class CommittedOnly(Shaping):
    """The broken variant: penalties from the committed text alone, as if the round's
    earlier drafts had not been written before the rows that follow them."""

    def apply(self, logits, context, drafts):
        return super().apply(logits, context, [])


class FirstRowOnly(Shaping):
    """Broken: the bias applied to the first row of a verify pass only."""

    def apply(self, logits, context, drafts):
        out = np.array(logits, dtype=np.float32)
        out[:1] = super().apply(logits[:1], context, [])
        return out


class MaskOfTheCommittedText(Shaping):
    """Broken: every row masked as the row after the committed text (the round's
    drafts not walked through the grammar)."""

    def apply(self, logits, context, drafts):
        first = super().apply(logits[:1], context, [])
        out = np.array(logits, dtype=np.float32)
        out[:, ~np.isfinite(first[0])] = -np.inf
        return out


def exact_shaped(backend, prompt, params, make_shaping, length=LENGTH):
    """P(continuation) under the shaped target: a fresh shaping at every prefix."""
    def shape(logits, context):
        shaping = make_shaping()
        shaping.start(backend, len(prompt))
        return shaping.apply(logits[None], context, [])[0]
    return exact_distribution(backend, prompt, params, length, shape)


def sample_shaped(engine, prompt, params, make_shaping, num_samples, seed, length=LENGTH):
    rng = np.random.default_rng(seed)
    counts, drafted, accepted = Counter(), 0, 0
    for _ in range(num_samples):
        try:
            g = engine.generate(prompt, params, max_tokens=length, rng=rng, shaping=make_shaping())
        except (ValueError, IndexError):  # (a broken variant's) token the grammar refuses: an
            # impossible output, which the chi-square test scores as such
            counts[("refused",)] += 1
            continue
        counts[tuple(g.token_ids)] += 1
        drafted, accepted = drafted + g.stats.drafted, accepted + g.stats.accepted
    return counts, drafted, accepted


def toy():
    return ToyBackend.random(VOCAB, seed=1, scale=1.5, eos_token_id=EOS)


@pytest.mark.parametrize("make_shaping, seed", [(penalties, 30), (biased, 31), (grammar, 32), (repeats, 34)],
                         ids=["penalties", "bias", "grammar", "repeat_penalty"])
@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["model", "lookup"])
def test_shaped_sampling_is_exact_on_the_toy_model(make_shaping, seed, drafter):
    target = toy()
    params = SamplingParams(temperature=1.0)
    expected = exact_shaped(target, PROMPT, params, make_shaping)
    unshaped = exact_shaped(target, PROMPT, params, Shaping)
    assert expected.keys() != unshaped.keys() or any(  # the shaping really changes the target
        abs(expected[k] - unshaped[k]) > 0.01 for k in expected)
    made = DraftModel(target.perturbed(noise=1.0, seed=2)) if drafter == "model" else \
        PromptLookup(min_ngram=1, max_ngram=3)
    engine = Engine(target, made, num_draft=3)
    counts, drafted, accepted = sample_shaped(engine, PROMPT, params, make_shaping, 12_000, seed)
    assert 0 < accepted < drafted  # both outcomes of verification happened
    assert chi_square_pvalue(counts, expected) > SIGNIFICANCE


@pytest.mark.slow
@pytest.mark.parametrize("make_shaping, broken", [
    (penalties, lambda: CommittedOnly(presence_penalty=1.0, frequency_penalty=2.0)),
    (repeats, lambda: CommittedOnly(repeat_penalty=1.8, repeat_last_n=3))],
    ids=["penalties", "repeat_penalty"])
def test_penalties_counted_without_the_rounds_drafts_fail_the_same_test(make_shaping, broken):
    target = toy()
    params = SamplingParams(temperature=1.0)
    expected = exact_shaped(target, PROMPT, params, make_shaping)
    engine = Engine(target, DraftModel(target.perturbed(noise=1.0, seed=2)), num_draft=3)
    counts, _, _ = sample_shaped(engine, PROMPT, params, broken, 12_000, 30)
    assert chi_square_pvalue(counts, expected) < SIGNIFICANCE


@pytest.mark.parametrize("broken, make_shaping", [
    pytest.param(lambda: FirstRowOnly(logit_bias={3: 4.0, 4: -100.0}, frequency_penalty=1.5), biased,
                 marks=pytest.mark.slow),
    pytest.param(lambda: MaskOfTheCommittedText(rule=grammar().rule), grammar,
                 marks=pytest.mark.slow)], ids=["bias", "grammar"])
def test_bias_and_grammar_broken_variants_fail_the_same_test(broken, make_shaping):
    target = toy()
    params = SamplingParams(temperature=1.0)
    expected = exact_shaped(target, PROMPT, params, make_shaping)
    engine = Engine(target, DraftModel(target.perturbed(noise=1.0, seed=2)), num_draft=3)
    counts, _, _ = sample_shaped(engine, PROMPT, params, broken, 12_000, 33)
    assert chi_square_pvalue(counts, expected) < SIGNIFICANCE


def test_every_output_follows_the_grammar():
    target = toy()
    engine = Engine(target, DraftModel(target.perturbed(noise=1.0, seed=2)), num_draft=4)
    for seed in range(200):
        g = engine.generate(PROMPT, SamplingParams(temperature=1.0, seed=seed), max_tokens=6,
                            shaping=grammar())
        text = "".join(chr(ord("a") + t) for t in g.token_ids)
        assert text[:1] == "a" or text[:2] in ("b", "bc"), text
        assert set(text[2:]) <= set("abcdef"), text


@pytest.mark.parametrize("drafter, repeat", [
    ("model", False), pytest.param("model", True, marks=pytest.mark.slow),
    pytest.param("lookup", True, marks=pytest.mark.slow)], ids=["model", "model-repeat", "lookup-repeat"])
def test_shaped_sampling_is_exact_on_llamacpp(tiny_gguf_pair, drafter, repeat):
    """Penalties and bias through llama.cpp, a draft model or prompt lookup drafting
    (chi-square, 0.001); with ``repeat``, llama.cpp's repetition penalty over a window
    of 3 tokens instead of the bias."""
    target = LlamaCppBackend(tiny_gguf_pair[0], n_ctx=64)
    # (a prompt that repeats itself: prompt lookup finds copies to draft)
    prompt, params = [1, 4, 5, 6, 1, 4] if drafter == "lookup" else [1, 4, 5, 6], \
        SamplingParams(temperature=1.0, top_k=6)
    fields = dict(repeat_penalty=2.0, repeat_last_n=3) if repeat else dict(logit_bias={5: 2.0})
    fields.update(presence_penalty=1.5, frequency_penalty=1.0)
    expected = exact_shaped(target, prompt, params, lambda: Shaping(**fields))
    made = DraftModel(LlamaCppBackend(tiny_gguf_pair[1], n_ctx=64)) if drafter == "model" else \
        PromptLookup(min_ngram=1, max_ngram=3)
    engine = Engine(target, made, num_draft=2)
    counts, drafted, accepted = sample_shaped(engine, prompt, params, lambda: Shaping(**fields), 5000, seed=22)
    assert 0 < accepted < drafted
    assert chi_square_pvalue(counts, expected) > SIGNIFICANCE
    if drafter == "model":  # (prompt lookup's drafts here are rarely accepted past their first
        # token, where the broken variant differs: the draft model's show it)
        counts, _, _ = sample_shaped(engine, prompt, params, lambda: CommittedOnly(**fields), 5000, seed=22)
        assert chi_square_pvalue(counts, expected) < SIGNIFICANCE
    engine.close()


SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


@pytest.mark.parametrize("drafter", ["lookup", "auto"])
def test_greedy_constrained_output_equals_plain_constrained_output(smollm2_path, drafter):
    import json
    import edgespec
    engine = edgespec.load(str(smollm2_path), draft="lookup", n_ctx=1024,
                           num_draft="auto" if drafter == "auto" else 4)
    messages = [{"role": "user", "content": "Give a person's name and age as JSON."}]
    make = lambda: Shaping(rule=Grammar.json_schema(SCHEMA))  # noqa: E731
    plain = engine.chat(messages, stream=False, temperature=0, max_tokens=64, shaping=make(),
                        speculative=False)
    spec = engine.chat(messages, stream=False, temperature=0, max_tokens=64, shaping=make())
    assert json.loads(plain.text).keys() == {"name", "age"}
    prompt = chat_prompt_ids(engine.target, messages)
    assert_equal_up_to_a_near_tie(engine, prompt, plain.token_ids, spec.token_ids)
    engine.close()


@pytest.mark.slow
def test_grammar_sampling_is_exact_on_llamacpp(tmp_path):
    """A grammar through llama.cpp, a draft model drafting (chi-square, 0.001); its broken
    variant, every row masked as after the committed text, fails the same test. (A pair
    with byte tokens: a grammar's vocabulary needs every text to be tokenizable.)"""
    weights = tiny_llama_weights(vocab_size=3 + 256 + 6, seed=7, eos_logit_scale=0.3)
    paths = [write_tiny_llama_gguf(tmp_path / f"{name}.gguf", w, byte_tokens=True) for name, w in
             (("target", weights), ("draft", perturbed(weights, scale=0.3, seed=8)))]
    target, draft = (LlamaCppBackend(path, n_ctx=64) for path in paths)
    prompt, params = [1, 259, 260, 261], SamplingParams(temperature=2.0)  # (flat: rows differ)
    rule = Grammar.regex("(ab|ba|cc)+")  # (what may follow depends on the state: pairs)
    make = lambda: Shaping(rule=rule)  # noqa: E731
    expected = exact_shaped(target, prompt, params, make)
    engine = Engine(target, DraftModel(draft), num_draft=2)
    counts, drafted, accepted = sample_shaped(engine, prompt, params, make, 4000, seed=23)
    assert 0 < accepted < drafted
    assert chi_square_pvalue(counts, expected) > SIGNIFICANCE
    broken = lambda: MaskOfTheCommittedText(rule=rule)  # noqa: E731
    counts, _, _ = sample_shaped(engine, prompt, params, broken, 4000, seed=23)
    assert chi_square_pvalue(counts, expected) < SIGNIFICANCE
    engine.close()
