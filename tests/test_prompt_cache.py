"""Saved prompts (the prompt cache): a conversation a side request would evict is
kept in host RAM, and the next request that repeats it restores it.

The policy (longest prefix, least recently used, the budget) on states that are
plain byte counts; then the real llama.cpp (tiny models and SmolLM2) and the real
MLX saving and restoring their KV caches, the A1, S, A2 shape of a coding
assistant's session through the engine and through the real server, and the
faults: a state of another model, an interrupted restore, a cancel.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
import numpy as np
import pytest

import edgespec
from edgespec.backends.llamacpp import LlamaCppBackend
from edgespec.core.cache import CachedModel
from edgespec.core.engine import Engine
from edgespec.core.prompt_cache import PromptCache
from edgespec.core.prompting import chat_prompt_ids
from edgespec.core.sampling import SamplingParams
from edgespec.errors import EdgespecError

from greedy import assert_equal_up_to_a_near_tie

GREEDY = SamplingParams(temperature=0)


@dataclass
class Blob:
    """A saved state that is only its size (the policy reads nothing else)."""

    nbytes: int


# -- the policy -------------------------------------------------------------------------

def test_the_longest_shared_prefix_wins_and_only_the_same_models():
    cache = PromptCache(10_000, min_tokens=4)
    cache.save("m", list(range(100)), Blob(100), 100)
    cache.save("m", list(range(50)) + [7] * 60, Blob(100), 100)
    cache.save("other", list(range(200)), Blob(100), 100)
    entry, n = cache.best("m", list(range(80)) + [1, 2])
    assert (entry.tokens[:100], n) == (list(range(100)), 80)
    entry, n = cache.best("m", list(range(50)) + [7] * 10)
    assert n == 60 and entry.tokens[50] == 7
    assert cache.best("nobody", list(range(10))) == (None, 0)


def test_the_least_recently_used_goes_when_the_budget_is_full():
    cache = PromptCache(300, min_tokens=4)
    a, b, c = ([i] * 10 for i in (1, 2, 3))
    for tokens in (a, b, c):
        assert cache.save("m", tokens, Blob(100), 100)
    entry, _ = cache.best("m", a)
    cache.looked_up(entry, 10)  # a used again: b is now the oldest
    cache.save("m", [4] * 10, Blob(100), 100)
    held = {e.tokens[0] for e in cache._saved}
    assert held == {1, 3, 4}
    stats = cache.stats()
    assert (stats.evictions, stats.hits, stats.bytes, stats.entries) == (1, 1, 300, 3)
    assert not cache.save("m", [5] * 10, Blob(301), 301)  # larger than the whole budget
    assert cache.stats().entries == 3


def test_a_longer_state_of_the_same_conversation_replaces_the_shorter():
    cache = PromptCache(10_000, min_tokens=4)
    cache.save("m", list(range(20)), Blob(20), 20)
    assert cache.holds("m", list(range(10)))
    cache.save("m", list(range(40)), Blob(40), 40)
    assert [len(e.tokens) for e in cache._saved] == [40]


def test_a_budget_below_zero_is_refused():
    with pytest.raises(ValueError, match="budget"):
        PromptCache(-1)


# -- llama.cpp's states ---------------------------------------------------------------

def test_a_restored_state_gives_the_logits_of_the_tokens_it_holds(tiny_gguf_pair):
    target, _ = tiny_gguf_pair
    backend = LlamaCppBackend(target, n_ctx=256)
    tokens = [1, 4, 9, 3, 12, 7, 2, 8]
    backend.forward(tokens)
    cold = backend.forward([5])[-1]  # (one token after the others, as after the restore)
    backend.rewind(len(tokens))
    state = backend.save_state()
    backend.rewind(0)
    backend.forward([3, 3, 3, 3])  # another conversation in between
    backend.load_state(state)
    assert backend.n_past == len(tokens)
    np.testing.assert_array_equal(backend.forward([5])[-1], cold)


def test_a_state_of_another_model_or_context_is_refused(tiny_gguf_pair, smollm2_path):
    target, _ = tiny_gguf_pair
    tiny, small = LlamaCppBackend(target, n_ctx=256), LlamaCppBackend(smollm2_path, n_ctx=256)
    small.forward([1, 2, 3, 4])
    with pytest.raises(EdgespecError, match="refused a saved state"):
        tiny.load_state(small.save_state())  # llama.cpp itself checks the layers' shapes
    assert tiny.n_past == 0 and tiny.forward([1, 2]).shape[0] == 2  # and tiny is usable
    # Through the caches: another context size is another key, refused before llama.cpp.
    shared = PromptCache(2**30, min_tokens=4)
    a = CachedModel(LlamaCppBackend(target, n_ctx=256), shared)
    b = CachedModel(LlamaCppBackend(target, n_ctx=512), shared)
    a.forward(list(range(1, 9)))
    assert a.keep()
    entry, _ = shared.best(a.key, list(range(1, 9)))
    assert shared.best(b.key, list(range(1, 9))) == (None, 0)
    with pytest.raises(EdgespecError, match="another model or context size"):
        b._restore(entry, entry.state)


def test_a_zero_budget_saves_nothing(tiny_gguf_pair):
    target, _ = tiny_gguf_pair
    off = PromptCache(0)
    cache = CachedModel(LlamaCppBackend(target, n_ctx=256), off)
    cache.forward([1, 2, 3] * 30)
    assert cache.reuse([5, 6, 7] * 30) == (0, 0)
    assert not cache.keep()
    assert off.stats().entries == 0


def _shift_case(target, kernels: str, shift_min: int):
    """A cache holding prefix, middle, chunk; then a context of prefix, chunk, more (the
    middle dropped, as a client trimming its history does). Returns the cache and
    what ``reuse`` kept."""
    prefix, middle, chunk = [1, 2, 3, 4], [5, 6] * 6, [7, 8, 9, 10, 11, 12] * 3
    cache = CachedModel(LlamaCppBackend(target, n_ctx=256, kernels=kernels),
                        PromptCache(0, min_tokens=4, shift_min=shift_min))
    cache.forward(prefix + middle + chunk)
    context = prefix + chunk + [3, 5]
    return cache, context, cache.reuse(context)


def test_cache_reuse_shifts_a_chunk_after_a_dropped_middle(tiny_gguf_pair):
    target, _ = tiny_gguf_pair
    cache, context, (kept, restored) = _shift_case(target, "fast", shift_min=8)
    assert (kept, restored) == (22, 0)  # the prefix and the whole chunk, moved back by 12
    assert cache.tokens == context[:22] and cache.backend.n_past == 22
    assert cache.restores == 1  # what a drafter computed on the old contents is void
    shifted = cache.forward(context[22:])[-1]
    cold = LlamaCppBackend(target, n_ctx=256, kernels="fast").forward(context)[-1]
    assert np.all(np.isfinite(shifted)) and shifted.shape == cold.shape
    # The chunk's K/V were computed after the middle: close to a cold run, not equal.
    assert not np.array_equal(shifted, cold)


def test_cache_reuse_is_off_by_default_below_its_chunk_and_with_exact_kernels(tiny_gguf_pair, smollm2_path):
    target, _ = tiny_gguf_pair
    assert _shift_case(target, "fast", shift_min=0)[2] == (4, 0)  # off: the prefix only
    assert _shift_case(target, "fast", shift_min=19)[2] == (4, 0)  # the chunk is 18 tokens
    cache, _, kept = _shift_case(smollm2_path, "exact", shift_min=8)
    assert cache.backend.bit_exact
    assert kept == (4, 0) and cache.backend.n_past == 4  # exact kernels: only prefixes
    with pytest.raises(EdgespecError, match="cache-reuse"):
        edgespec.load(target, cache_reuse=-1)


def test_ctrl_c_during_a_restore_leaves_the_cache_true(tiny_gguf_pair, monkeypatch):
    target, _ = tiny_gguf_pair
    backend = LlamaCppBackend(target, n_ctx=256)
    cache = CachedModel(backend, PromptCache(2**30, min_tokens=4))
    first, second = [1, 4, 9, 3, 12, 7, 2, 8] * 2, [5, 5, 6, 6, 11, 11, 10, 10] * 2
    cache.forward(first)
    cache.reuse(second)  # first is saved as second replaces it
    cache.forward(second)
    real = backend.load_state

    def interrupted(state):  # Ctrl-C lands just as the copy finishes
        real(state)
        raise KeyboardInterrupt
    monkeypatch.setattr(backend, "load_state", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cache.reuse(first + [3])
    assert cache.tokens == [] and backend.n_past == 0
    monkeypatch.setattr(backend, "load_state", real)
    assert cache.reuse(first + [3]) == (len(first), len(first))  # the saved state is still there
    fresh = LlamaCppBackend(target, n_ctx=256)
    fresh.forward(first)
    np.testing.assert_array_equal(cache.forward([3])[-1], fresh.forward([3])[-1])


# -- the session shape: an edit, a side request, the follow-up ------------------------

def _prompts(engine):
    """A1 (a long chat), S (another long prompt) and A2 (A1, its reply, a follow-up)."""
    code = "\n".join(f"def f{i}(x):\n    return x * {i} + {i % 7}" for i in range(20))
    a1 = [{"role": "system", "content": "You are a careful coding assistant."},
          {"role": "user", "content": f"Here is my file:\n{code}\nRename f3 to triple."}]
    side = [{"role": "system", "content": "Summarize the conversation in one line."},
            {"role": "user", "content": "The user asked: " + " ".join(["rename a function"] * 30)}]
    return a1, side


def edit_side_follow_up(engine, max_tokens: int):
    """A1, then S, then A2 through ``engine``: A1's result and A2's, and A2's messages."""
    a1, side = _prompts(engine)
    first = engine.chat(a1, stream=False, params=GREEDY, max_tokens=max_tokens)
    engine.chat(side, stream=False, params=GREEDY, max_tokens=8)
    a2 = a1 + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "Thanks. Now f4."}]
    return first, engine.chat(a2, stream=False, params=GREEDY, max_tokens=max_tokens), a2


@pytest.mark.parametrize("kernels", ["exact", pytest.param("fast", marks=pytest.mark.slow)])
def test_the_follow_up_after_a_side_request_restores_its_prompt(smollm2_path, kernels):
    engine = edgespec.load(smollm2_path, draft="lookup", num_draft=4, n_ctx=2048, kernels=kernels,
                           cache_ram=512)
    _, follow, a2 = edit_side_follow_up(engine, 24)
    stats = follow.stats
    assert stats.prompt_restored_tokens > 0.9 * stats.prompt_tokens
    assert stats.prompt_eval_tokens <= 0.05 * stats.prompt_tokens
    assert engine.prompt_cache.stats().hits >= 1
    # The same follow-up cold: every token is evaluated, and the reply is the same
    # (token for token with exact kernels; up to a near-tie with fast ones, where the
    # reply's own tokens were decoded one at a time and the cold run batches them).
    ids = chat_prompt_ids(engine.target, a2)
    engine.target_cache.rewind(0)
    engine.prompt_cache.clear()
    cold = engine.generate(ids, GREEDY, max_tokens=24)
    assert cold.stats.prompt_eval_tokens == len(ids)
    if kernels == "exact":
        assert follow.token_ids == cold.token_ids
    else:
        assert_equal_up_to_a_near_tie(engine, ids, cold.token_ids, follow.token_ids)
    engine.close()


def test_without_the_prompt_cache_the_follow_up_pays_its_prompt_again(smollm2_path):
    engine = edgespec.load(smollm2_path, draft="lookup", num_draft=4, n_ctx=2048, cache_ram=0)
    _, follow, _ = edit_side_follow_up(engine, 8)
    assert follow.stats.prompt_eval_tokens > 0.9 * follow.stats.prompt_tokens
    engine.close()


def test_a_cancel_as_a_restore_begins_leaves_the_engine_usable(smollm2_path):
    import threading
    engine = edgespec.load(smollm2_path, draft="lookup", num_draft=4, n_ctx=2048, cache_ram=512)
    a1, side = _prompts(engine)
    first = engine.chat(a1, stream=False, params=GREEDY, max_tokens=16)
    engine.chat(side, stream=False, params=GREEDY, max_tokens=4)
    cancel = threading.Event()
    cancel.set()
    again = engine.chat(a1, stream=False, params=GREEDY, max_tokens=16, cancel=cancel)
    assert again.finish_reason == "cancelled"
    again = engine.chat(a1, stream=False, params=GREEDY, max_tokens=16)
    assert again.token_ids == first.token_ids
    assert again.stats.prompt_eval_tokens <= 2  # the last prompt token (and the pending one)
    engine.close()


def test_the_server_reports_the_restored_prompt(smollm2_path):
    from test_server import RunningServer
    engine = edgespec.load(smollm2_path, draft="lookup", num_draft=4, n_ctx=2048, cache_ram=512)
    server = RunningServer(engine)
    try:
        client = server.client()
        a1, side = _prompts(engine)
        first = client.chat.completions.create(model="m", messages=a1, max_tokens=16, temperature=0)
        client.chat.completions.create(model="m", messages=side, max_tokens=4, temperature=0)
        a2 = a1 + [{"role": "assistant", "content": first.choices[0].message.content},
                   {"role": "user", "content": "Thanks. Now f4."}]
        follow = client.chat.completions.create(model="m", messages=a2, max_tokens=8, temperature=0)
        usage = follow.usage
        assert usage.prompt_tokens_details.cached_tokens >= 0.95 * usage.prompt_tokens
        metrics = httpx.get(server.url + "/metrics").text
        assert "edgespec:prompt_cache_hits_total 1.0" in metrics
        assert "edgespec:prompt_cache_bytes" in metrics
        assert "edgespec:spec_decode_num_drafts_total" in metrics
        # A side request and the follow-up at once: one waits while the other saves or
        # restores, and both get the replies they get alone.
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(2) as pool:
            both = list(pool.map(lambda m: client.chat.completions.create(
                model="m", messages=m, max_tokens=8, temperature=0), [side, a2]))
        assert both[1].choices[0].message.content == follow.choices[0].message.content
    finally:
        server.stop()
        engine.close()


# -- MLX --------------------------------------------------------------------------------

def test_mlx_restores_a_saved_cache(tmp_path):
    pytest.importorskip("mlx_lm")
    from ggufs import tiny_llama_weights, write_tiny_mlx_model
    from edgespec.models.loading import BackendOptions, load_backend
    folder = write_tiny_mlx_model(tmp_path / "tiny-mlx", tiny_llama_weights(seed=3))
    backend = load_backend(str(folder), BackendOptions(backend="mlx", n_ctx=256))
    tokens = [1, 4, 9, 3, 12, 7, 2, 8]
    backend.forward(tokens)
    cold = backend.forward([5])[-1]
    backend.rewind(len(tokens))
    state = backend.save_state()
    backend.forward([6, 6, 6])  # the cache is written after the save: the saved copy stays
    backend.rewind(0)
    backend.forward([3, 3, 3, 3])
    backend.load_state(state)
    assert backend.n_past == len(tokens)
    np.testing.assert_array_equal(backend.forward([5])[-1], cold)
