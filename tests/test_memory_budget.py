"""Issue 66: everything conversations leave behind counts in bytes, under one budget.

The drafters' memory of other conversations (prompt lookup's and the suffix drafter's
copy indexes, the suffix drafter's counts) is counted (checked against what tracemalloc
sees), and :meth:`PromptCache.settle` drops the least recently used piece, a saved state
or a drafter's other conversation, until the states and the drafters' memory fit.
"""

from __future__ import annotations

import gc
import random
import tracemalloc

import httpx
import pytest

from edgespec.core.prompt_cache import PromptCache
from edgespec.drafters import PromptLookup, SuffixDrafter
from edgespec.drafters.copying import CopyIndex, _index_bytes

from test_server import HELLO, RunningServer, engine  # noqa: F401 - the module's engine fixture
from test_server_access import metric


def text(length: int, vocab: int, seed: int) -> list[int]:
    """Token ids that copy earlier stretches of themselves half the time (as code does)."""
    rng, out = random.Random(seed), []
    while len(out) < length:
        if out and rng.random() < 0.5:
            start = rng.randrange(len(out))
            out += out[start:start + rng.randrange(5, 60)]
        else:
            out += [rng.randrange(300, 300 + vocab) for _ in range(rng.randrange(3, 30))]
    return out[:length]


def traced(build):
    """(what ``build()`` returns, the bytes tracemalloc sees it allocate and keep)."""
    gc.collect()
    tracemalloc.start()
    try:
        made = build()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return made, held


@pytest.mark.parametrize("length, vocab", [(2000, 40000), (4000, 3000), (6000, 500)])
def test_the_drafters_count_their_memory_near_what_it_takes(length, vocab):
    tokens = text(length, vocab, seed=length)

    def index():
        copies = CopyIndex()
        copies.follow(tokens)
        return copies
    copies, held = traced(index)
    assert 0.8 * held <= copies.memory_bytes() <= 1.5 * held, (copies.memory_bytes(), held)

    def suffix():
        drafter = SuffixDrafter()
        drafter.prefill(tokens)
        return drafter
    drafter, held = traced(suffix)
    counted = sum(drafter.memory().values())
    assert 0.8 * held <= counted <= 1.5 * held, (drafter.memory(), held)


def conversations(lookup: PromptLookup, count: int, length: int = 3000) -> list[list[int]]:
    """``count`` conversations indexed one after another (each left for the next)."""
    made = [text(length, 20000, seed=i) for i in range(count)]
    for tokens in made:
        lookup.prefill(tokens)
    return made


def test_settle_drops_the_oldest_conversations_until_all_fits():
    lookup = PromptLookup()
    made = conversations(lookup, 5)  # 4 kept, one live
    per_conversation = lookup.memory()["copy_indexes"] / 5
    cache = PromptCache(int(2.5 * per_conversation))
    cache.settle([lookup])
    held = cache.memory()
    assert sum(held.values()) <= cache.budget
    assert held["copy_indexes"] == lookup.memory()["copy_indexes"] > 0
    # The two most recently left are kept (a switch back finds them), the older ones gone.
    assert [len(kept["tokens"]) for kept in lookup.copies._kept] == [3000]
    lookup.prefill(made[3] + [1, 2, 3])  # continues the one left last: taken back, not rebuilt
    assert lookup.copies.tokens[:3000] == made[3] and lookup.copies.oldest_kept() is not None


def test_states_and_drafter_memory_share_one_budget_least_recently_used_first():
    lookup = PromptLookup()
    conversations(lookup, 3)  # two kept, left before the states below are saved
    live = _index_bytes(lookup.copies._index, lookup.copies.tokens)
    cache = PromptCache(live + 12_000)
    for i in range(3):
        cache.save("m", list(range(i * 100, i * 100 + 80)), b"x" * 4000, 4000)
    cache.settle([lookup])
    held = cache.memory()
    assert sum(held.values()) <= cache.budget
    # The kept conversations were used before any state: they went first; the states stay.
    assert held["prompt_states"] == 12_000 and lookup.copies.oldest_kept() is None
    # Then the states go, the oldest first, when the live index alone nearly fills it.
    cache.budget = live + 5000
    cache.settle()
    assert cache.memory()["prompt_states"] == 4000
    assert cache.best("m", list(range(200, 280)))[1] == 80  # the newest kept


def test_without_a_budget_nothing_is_counted_or_dropped():
    lookup = PromptLookup()
    conversations(lookup, 3)
    cache = PromptCache(0)
    cache.settle([lookup])
    assert len(lookup.copies._kept) == 2 and cache.memory() == {"prompt_states": 0}


def test_metrics_show_each_part_of_the_memory(engine):  # noqa: F811
    running = RunningServer(engine)
    try:
        for drafter in ("lookup", "suffix"):
            reply = httpx.post(running.url + "/v1/chat/completions", timeout=120, json={
                "messages": HELLO, "max_tokens": 8, "speculative": {"drafter": drafter}})
            assert reply.status_code == 200, reply.text
        for part in ("copy_indexes", "suffix_counts", "prompt_states"):
            assert f'edgespec:memory_bytes{{part="{part}"}}' in httpx.get(running.url + "/metrics").text
        assert metric(running.url, "edgespec:memory_bytes", part="copy_indexes") > 0
        assert metric(running.url, "edgespec:memory_bytes", part="suffix_counts") > 0
        assert metric(running.url, "edgespec:memory_budget_bytes") == engine.prompt_cache.budget
    finally:
        running.stop()
