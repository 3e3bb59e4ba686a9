"""The round loop on the toy backend: greedy equality, stopping, caches, stats."""

import pytest

from edgespec import DraftModel, EdgespecError, Engine, PromptLookup, SamplingParams
from edgespec.backends.toy import ToyBackend
from edgespec.drafters.suffix import SuffixDrafter
from edgespec.core.detokenize import IncrementalDetokenizer, StopMatcher

GREEDY = SamplingParams(temperature=0)


def toy_pair(vocab=12, noise=0.7):
    target = ToyBackend.random(vocab, seed=5, scale=2.0)
    return target, target.perturbed(noise=noise, seed=6)


@pytest.mark.parametrize("make_drafter", [
    lambda draft: DraftModel(draft),
    lambda draft: PromptLookup(min_ngram=1, max_ngram=3),
], ids=["draft-model", "lookup"])
@pytest.mark.parametrize("num_draft", [1, 3, 6])
def test_greedy_speculative_equals_greedy_plain(make_drafter, num_draft):
    target, draft = toy_pair()
    engine = Engine(target, make_drafter(draft), num_draft=num_draft)
    prompt = [0, 1, 2, 3, 0, 1]
    plain = engine.generate(prompt, GREEDY, max_tokens=80, speculative=False)
    spec = engine.generate(prompt, GREEDY, max_tokens=80)
    assert spec.token_ids == plain.token_ids
    assert len(spec.token_ids) == 80
    assert spec.stats.drafted > 0 and spec.stats.accepted > 0
    # Fewer target passes than tokens is the whole point.
    assert spec.stats.rounds + spec.stats.plain_steps < 80
    assert plain.stats.rounds == 0 and plain.stats.plain_steps == 80


def test_all_accepted_rounds_keep_the_drafter_aligned():
    """A twin drafter has every draft accepted: it never ran on its last draft."""
    target, _ = toy_pair()
    twin = ToyBackend(target.table.copy())
    engine = Engine(target, DraftModel(twin), num_draft=4)
    plain = engine.generate([1, 2], GREEDY, max_tokens=41, speculative=False)
    spec = engine.generate([1, 2], GREEDY, max_tokens=41)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.acceptance_rate == 1.0
    assert spec.stats.mean_accepted_length == 5.0
    assert spec.stats.rounds == 8 and spec.stats.plain_steps == 1  # 8 * 5 + 1 = 41


def test_stats_count_what_the_rounds_did():
    """The stats against a record of each round the planner heard of: drafts per
    position, rounds and plain steps as they happened; accepted drafts exactly the
    emitted tokens that came from drafts (accepted drafts after the finish uncounted)."""
    target, draft = toy_pair()
    engine = Engine(target, DraftModel(draft), num_draft=4)
    rounds, observe = [], engine.planner.observe
    engine.planner.observe = lambda result: (rounds.append(result), observe(result))
    g = engine.generate([3, 4, 5], SamplingParams(temperature=1.0, seed=7), max_tokens=60)
    s = g.stats
    assert s.generated_tokens == 60 == len(g.token_ids)
    verified = [r for r in rounds if r.num_drafted]
    assert s.rounds == len(verified) and s.plain_steps == len(rounds) - len(verified)
    assert s.drafted == sum(r.num_drafted for r in verified)
    assert s.drafted_per_position == [sum(r.num_drafted > i for r in verified) for i in range(4)]
    assert s.accepted == sum(g.from_draft)  # accepted drafts after the finish never emitted
    assert sum(r.num_accepted for r in verified) - s.accepted < 4  # (only the last round's)
    assert s.prompt_tokens == 3 and s.prompt_eval_tokens == 3
    assert s.tokens_per_second > 0 and s.decode_time_s >= s.draft_time_s
    assert s.to_dict()["acceptance_rate"] == s.acceptance_rate


def test_same_seed_same_output():
    target, draft = toy_pair()
    engine = Engine(target, DraftModel(draft), num_draft=3)
    params = SamplingParams(temperature=0.9, seed=123)
    assert engine.generate([1], params, max_tokens=30).token_ids == \
        engine.generate([1], params, max_tokens=30).token_ids


@pytest.mark.parametrize("drafter", [PromptLookup(min_ngram=1, max_ngram=3), SuffixDrafter(min_ngram=1)],
                         ids=["lookup", "suffix"])
def test_a_deterministic_drafter_reproduces_plain_sampling_for_a_seed(drafter):
    """q one-hot: the target samples its own token at every position (one uniform
    each, in order, as plain sampling does) and keeps drafts equal to it, so the
    same seed gives the same tokens with or without speculation."""
    target, _ = toy_pair()
    engine = Engine(target, drafter, num_draft=4)
    prompt = [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    for seed in range(3):
        params = SamplingParams(temperature=0.9, seed=seed)
        plain = engine.generate(prompt, params, max_tokens=80, speculative=False)
        spec = engine.generate(prompt, params, max_tokens=80)
        assert spec.token_ids == plain.token_ids
        assert 0 < spec.stats.accepted < spec.stats.drafted  # it drafted, and drafts were rejected
    other = engine.generate(prompt, SamplingParams(temperature=0.9, seed=99), max_tokens=80)
    assert other.token_ids != plain.token_ids  # the seed matters: the test could fail


def test_eos_stops_and_is_not_emitted():
    target = ToyBackend.random(6, seed=3, scale=2.0, eos_token_id=5)
    engine = Engine(target, PromptLookup(min_ngram=1), num_draft=3)
    g = engine.generate([0, 1], SamplingParams(temperature=1.0, seed=1), max_tokens=500)
    assert g.finish_reason == "stop" and 5 not in g.token_ids and len(g.token_ids) < 500


def test_stop_string_cuts_the_text():
    target, draft = toy_pair()
    engine = Engine(target, DraftModel(draft), num_draft=3)
    full = engine.generate([0], GREEDY, max_tokens=40).text
    stop = full[10:12]
    g = engine.generate([0], GREEDY, max_tokens=40, stop=[stop])
    assert g.finish_reason == "stop"
    assert g.text == full[:full.index(stop)]


def test_abandoned_stream_leaves_caches_consistent():
    target, draft = toy_pair()
    drafter = DraftModel(draft)
    engine = Engine(target, drafter, num_draft=4)
    stream = engine.stream([0, 1, 2], GREEDY, max_tokens=50)
    for _ in range(7):
        next(stream)
    stream.close()
    # The caches hold no rejected drafts: only committed tokens.
    assert target.n_past == len(engine.target_cache.tokens)
    assert draft.n_past == len(drafter.cache.tokens)
    committed = engine.target_cache.tokens
    assert committed[:3] == [0, 1, 2]
    again = engine.generate([0, 1, 2], GREEDY, max_tokens=50)
    assert again.token_ids == engine.generate([0, 1, 2], GREEDY, max_tokens=50,
                                              speculative=False).token_ids


def test_second_generation_reuses_the_shared_prefix():
    target, draft = toy_pair()
    engine = Engine(target, DraftModel(draft), num_draft=3)
    first = engine.generate([0, 1, 2, 3], GREEDY, max_tokens=10)
    follow_up = [0, 1, 2, 3] + first.token_ids + [4, 5]
    second = engine.generate(follow_up, GREEDY, max_tokens=5)
    # Only the new tokens (and the last generated one, still pending) are evaluated.
    assert second.stats.prompt_eval_tokens <= 3
    assert second.stats.prompt_tokens == len(follow_up)


def test_concurrent_generation_is_refused():
    target, draft = toy_pair()
    engine = Engine(target, DraftModel(draft))
    running = engine.stream([0], GREEDY, max_tokens=20)
    next(running)
    with pytest.raises(EdgespecError, match="already generating"):
        next(engine.stream([0], GREEDY, max_tokens=20))
    running.close()
    assert engine.generate([0], GREEDY, max_tokens=3).finish_reason == "length"


def test_prompt_longer_than_context_is_a_clear_error():
    target, _ = toy_pair()
    target.n_ctx = 8
    engine = Engine(target)
    with pytest.raises(EdgespecError, match="shorten the prompt"):
        engine.generate(list(range(10)), GREEDY)
    g = engine.generate([0, 1, 2], GREEDY, max_tokens=100)
    assert g.finish_reason == "length" and len(g.token_ids) == 5  # filled the context


def test_detokenizer_never_splits_a_character():
    text = "héllo, 世界 🎉"
    pieces = [bytes([b]) for b in text.encode()]
    detok = IncrementalDetokenizer(lambda i: pieces[i])
    out = [detok.add(i) for i in range(len(pieces))] + [detok.flush()]
    assert "".join(out) == text
    assert "\ufffd" not in "".join(out)


def test_stop_matcher_holds_back_possible_beginnings():
    m = StopMatcher(["</end>"])
    assert m.feed("abc</") == ("abc", False)
    assert m.feed("en") == ("", False)
    assert m.feed("x") == ("</enx", False)
    assert m.feed("y</end>z") == ("y", True)


@pytest.mark.parametrize("options, field", [
    ({"temperature": "0.7"}, "temperature"), ({"temperature": None}, "temperature"),
    ({"top_p": "0.9"}, "top_p"), ({"top_k": True}, "top_k"), ({"max_tokens": 1.5}, "max_tokens"),
    ({"max_tokens": None}, "max_tokens"), ({"max_tokens": 0}, "max_tokens"),
])
def test_bad_api_values_name_the_field_before_any_work(options, field):
    target, drafter = toy_pair()
    engine = Engine(target, DraftModel(drafter), num_draft=2)
    with pytest.raises(ValueError, match=field):
        engine.generate([0, 1, 2], **{"max_tokens": 5, **options})
    assert target.n_past == 0  # nothing was evaluated
    assert len(engine.generate([0, 1, 2], GREEDY, max_tokens=5).token_ids) == 5  # still works


@pytest.mark.parametrize("messages", ["hi", None, [], ["hi"], [{"role": "user"}],
                                      [{"role": "user", "content": None}], [{"content": "hi"}]])
def test_malformed_chat_messages_are_a_clear_error(messages):
    target, drafter = toy_pair()
    engine = Engine(target, DraftModel(drafter), num_draft=2)
    with pytest.raises(EdgespecError, match="message"):
        engine.chat(messages, params=GREEDY, max_tokens=3)
    reply = engine.chat([{"role": "user", "content": "abc"}], stream=False, params=GREEDY,
                        max_tokens=3)
    assert len(reply.token_ids) == 3


def test_a_vanishing_temperature_samples_the_argmax_instead_of_failing():
    """1/T overflows float32 below T ~ 3e-39 (inf - inf = NaN); it is capped, so such a
    temperature is greedy (ties shared) from the first token to the last."""
    target, drafter = toy_pair()
    engine = Engine(target, DraftModel(drafter), num_draft=2)
    greedy = engine.generate([0, 1, 2], GREEDY, max_tokens=20).token_ids
    for temperature in (1e-45, 1e-320):
        assert engine.generate([0, 1, 2], temperature=temperature, seed=1,
                               max_tokens=20).token_ids == greedy
