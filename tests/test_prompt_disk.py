"""Saved prompts on disk: a conversation survives a restart of its engine (a chat
started again, a server restarted), and a folder that went wrong costs a cold prefill
and a warning, never a wrong state or a crash.

Real llama.cpp (SmolLM2 and its Q2_K copy, tiny random GGUFs) and real MLX save and
restore their KV caches through a real folder; the faults are made on the real files
(truncated, a byte changed, renamed as another model's, a full disk through the
process's file size limit, two processes writing, a process killed before its rename).
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import edgespec
from edgespec.backends.llamacpp import LlamaCppBackend
from edgespec.core.cache import PREFILL_CHUNK, CachedModel
from edgespec.core.prompt_cache import PromptCache
from edgespec.core.prompt_disk import PARTIAL, SUFFIX, PromptDisk
from edgespec.core.prompting import chat_prompt_ids
from edgespec.core.sampling import SamplingParams

from greedy import assert_equal_up_to_a_near_tie

GREEDY = SamplingParams(temperature=0)
TESTS = Path(__file__).parent


def conversation(turns: int = 3, functions: int = 26) -> list[dict]:
    """A conversation about a file of ``functions`` functions (the default: ~600 tokens,
    longer than one prefill pass; 60: ~1,300)."""
    code = "\n".join(f"def step_{i}(state):\n    state['n'] += {i}\n    return state"
                     for i in range(functions))
    messages = [{"role": "system", "content": "You are a careful coding assistant."},
                {"role": "user", "content": f"Here is my module:\n{code}\nWhat does step_7 do?"}]
    for i in range(1, turns):
        messages += [{"role": "assistant", "content": f"It adds {7 + i} to the counter."},
                     {"role": "user", "content": f"And step_{7 + i}?"}]
    return messages


def load(path, folder, **options):
    return edgespec.load(str(path), draft="lookup", num_draft=4, n_ctx=2048, cache_dir=folder,
                         cache_disk=options.pop("cache_disk", 512), **options)


def first_turn(path, folder, messages, max_tokens=16, **options):
    """Reply to ``messages`` in an engine that then closes (writing its states); returns
    the conversation with the reply and one more question."""
    engine = load(path, folder, **options)
    reply = engine.chat(messages, stream=False, params=GREEDY, max_tokens=max_tokens)
    engine.close()
    return messages + [{"role": "assistant", "content": reply.text},
                       {"role": "user", "content": "Now rename it to advance."}]


def files(folder) -> list[Path]:
    return sorted(Path(folder).glob("*" + SUFFIX))


def folder_bytes(folder) -> int:
    return sum(p.stat().st_size for p in Path(folder).iterdir() if p.name != ".lock")


# -- a restart ---------------------------------------------------------------------------

def test_a_conversation_survives_a_restart_and_replies_as_a_cold_run(smollm2_path, tmp_path):
    follow = first_turn(smollm2_path, tmp_path, conversation())
    assert len(files(tmp_path)) == 1  # written when the engine closed
    engine = load(smollm2_path, tmp_path)
    ids = chat_prompt_ids(engine.target, follow)
    restored = engine.generate(ids, GREEDY, max_tokens=24)
    stats = restored.stats
    assert stats.prompt_restored_tokens > 0.9 * len(ids) and stats.prompt_eval_tokens < 0.1 * len(ids)
    assert engine.prompt_cache.stats().disk_hits == 1
    engine.close()
    cold = edgespec.load(str(smollm2_path), draft="lookup", num_draft=4, n_ctx=2048)
    reference = cold.generate(ids, GREEDY, max_tokens=24)
    assert reference.stats.prompt_eval_tokens == len(ids)
    # Fast kernels: the reply's own tokens were decoded one at a time before the restart
    # and are batched in the cold run: the same reply up to a near-tie.
    assert_equal_up_to_a_near_tie(cold, ids, reference.token_ids, restored.token_ids)
    cold.close()


@pytest.mark.parametrize("quant", [pytest.param("q4_1", marks=pytest.mark.slow), "q2_k"])
def test_with_exact_kernels_a_restored_prompt_gives_the_cold_runs_tokens(
        smollm2_path, smollm2_q2k_path, tmp_path, quant):
    """Q4_1's prompt passes round as one-token steps (everything cached is reused); Q2_K's
    do not (repacked weights), so only K/V from whole prompt passes is restored there."""
    path = smollm2_path if quant == "q4_1" else smollm2_q2k_path
    follow = first_turn(path, tmp_path, conversation(), max_tokens=24, kernels="exact")
    engine = load(path, tmp_path, kernels="exact")
    assert engine.target.exact_prefill == (quant == "q4_1")
    ids = chat_prompt_ids(engine.target, follow)
    assert len(ids) > PREFILL_CHUNK
    restored = engine.generate(ids, GREEDY, max_tokens=24)
    kept = restored.stats.prompt_restored_tokens
    if quant == "q2_k":
        assert kept > 0 and kept % PREFILL_CHUNK == 0  # whole passes only
    else:
        assert kept > 0.9 * len(ids)
    engine.close()
    cold = edgespec.load(str(path), draft="lookup", num_draft=4, n_ctx=2048, kernels="exact")
    assert cold.generate(ids, GREEDY, max_tokens=24).token_ids == restored.token_ids
    cold.close()


def test_exact_kernels_restore_no_kv_a_cold_prefill_would_compute_otherwise(smollm2_q2k_path, tmp_path):
    """Why only whole prompt passes are restored where they round otherwise: the next
    logits after a restored state are a cold prefill's bit for bit; after a state whose
    last tokens were decoded one at a time (what a restart would bring back whole), not."""
    backend = LlamaCppBackend(smollm2_q2k_path, n_ctx=2048, kernels="exact")
    cache = CachedModel(backend, PromptCache(0, disk=PromptDisk(tmp_path, 256 * 2**20)))
    prompt = [int(t) for t in np.random.default_rng(0).integers(100, 40000, 600)]
    reply = [int(t) for t in np.random.default_rng(1).integers(100, 40000, 40)]
    assert cache.prefill(prompt) == (len(prompt), 0)
    for token in reply:  # decoded as a generation does: one token a pass
        cache.forward([token])
    assert cache.aligned == 512 and cache.keep() and len(files(tmp_path)) == 1  # (no RAM: to disk)
    context = prompt + reply + [7, 8, 9]
    fresh = CachedModel(backend, cache.prompt_cache)
    evaluated, restored = fresh.prefill(context[:-1])
    assert restored == 512 and evaluated == len(context) - 1 - 512
    after_restore = fresh.forward(context[-1:])[-1]
    fresh.rewind(0)
    fresh.prompt_cache = None
    fresh.prefill(context[:-1])
    np.testing.assert_array_equal(after_restore, fresh.forward(context[-1:])[-1])
    # The whole state (the reply's rows too), as a restore of everything would give:
    whole = CachedModel(backend)
    whole.sync(prompt, need_logits=False)
    for token in reply:
        whole.forward([token])
    whole.sync(context[:-1], need_logits=False)
    assert not np.array_equal(after_restore, whole.forward(context[-1:])[-1])
    backend.close()


def test_a_new_chat_with_a_system_prompt_seen_before_restores_it(smollm2_path, tmp_path):
    system = {"role": "system", "content": "You review Python code. " + "Be precise and brief. " * 60}
    first_turn(smollm2_path, tmp_path, [system, {"role": "user", "content": "Is `x = x + 1` fine?"}])
    engine = load(smollm2_path, tmp_path)
    reply = engine.chat([system, {"role": "user", "content": "What is a list comprehension?"}],
                        stream=False, params=GREEDY, max_tokens=4)
    assert reply.stats.prompt_restored_tokens > 0.8 * reply.stats.prompt_tokens
    engine.close()


def test_mlx_saves_and_restores_through_the_folder(tmp_path):
    pytest.importorskip("mlx.core")
    from ggufs import tiny_llama_weights, write_tiny_mlx_model
    from edgespec.backends.mlx_backend import load_mlx_folder
    folder = write_tiny_mlx_model(tmp_path / "model", tiny_llama_weights(seed=3))
    disk = PromptDisk(tmp_path / "cache", 64 * 2**20)
    backend = load_mlx_folder(folder, name="tiny", n_ctx=1024, kernels="fast")
    cache = CachedModel(backend, PromptCache(0, disk=disk))
    prompt = [int(t) for t in np.random.default_rng(2).integers(3, 16, 300)]
    cache.prefill(prompt)
    expected = cache.forward([5])[-1]
    assert cache.keep()
    again = CachedModel(load_mlx_folder(folder, name="tiny", n_ctx=1024, kernels="fast"),
                        PromptCache(0, disk=PromptDisk(tmp_path / "cache", 64 * 2**20)))
    assert again.prefill(prompt + [5]) == (0, len(prompt) + 1)  # all of it restored
    again.rewind(len(prompt))
    np.testing.assert_array_equal(again.forward([5])[-1], expected)


# -- faults: each a cold prefill and a warning -----------------------------------------
# On tiny random GGUF models (a target and another model of its shape), prompts of ids.

PROMPT = [int(t) for t in np.random.default_rng(5).integers(3, 16, 400)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Two tiny models of one shape (their states fit each other's llama.cpp), whose
    context holds long prompts."""
    from ggufs import perturbed, tiny_llama_weights, write_tiny_llama_gguf
    folder = tmp_path_factory.mktemp("tiny-disk")
    weights = tiny_llama_weights(seed=6, eos_logit_scale=0.05)
    return (write_tiny_llama_gguf(folder / "a.gguf", weights, context_length=2048),
            write_tiny_llama_gguf(folder / "b.gguf", perturbed(weights, scale=0.3, seed=7),
                                  context_length=2048))


def tiny_engine(path, folder, *, n_ctx=1024, cache_disk=64):
    return edgespec.load(str(path), draft="lookup", num_draft=4, n_ctx=n_ctx, cache_dir=folder,
                         cache_disk=cache_disk)


def answered(path, folder, **options) -> list[int]:
    """PROMPT answered by an engine that then closes (writing its state); returns the
    follow-up's ids: PROMPT, the answer, more."""
    engine = tiny_engine(path, folder, **options)
    reply = engine.generate(PROMPT, GREEDY, max_tokens=8)
    engine.close()
    return PROMPT + reply.token_ids + [4, 5, 6]


def follow_up(path, folder, ids, caplog, **options):
    """The follow-up in a new engine on ``folder``: its result, and the warnings logged."""
    caplog.clear()
    engine = tiny_engine(path, folder, **options)
    with caplog.at_level(logging.WARNING, logger="edgespec.cache"):
        reply = engine.generate(ids, GREEDY, max_tokens=8)
    engine.close()
    return reply, [r.getMessage() for r in caplog.records if r.name == "edgespec.cache"]


@pytest.fixture(scope="module")
def saved(tiny, tmp_path_factory):
    """A folder holding one conversation's state, the follow-up to it, and its cold reply."""
    folder = tmp_path_factory.mktemp("saved")
    ids = answered(tiny[0], folder)
    engine = edgespec.load(str(tiny[0]), draft="lookup", num_draft=4, n_ctx=1024)
    cold = engine.generate(ids, GREEDY, max_tokens=8)
    engine.close()
    return folder, ids, cold


def damaged_copy(saved, tmp_path, damage) -> Path:
    folder = tmp_path / "copy"
    folder.mkdir()
    source = files(saved[0])[0]
    target = folder / source.name
    target.write_bytes(source.read_bytes())
    damage(target)
    return folder


def truncate(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 100)


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) * 2 // 3] ^= 0x40
    path.write_bytes(bytes(data))


def test_the_saved_state_restores_when_nothing_is_wrong(tiny, saved, tmp_path, caplog):
    folder = damaged_copy(saved, tmp_path, lambda p: None)
    reply, warnings = follow_up(tiny[0], folder, saved[1], caplog)
    assert reply.stats.prompt_restored_tokens > 0.9 * len(saved[1]) and not warnings
    assert reply.token_ids == saved[2].token_ids


@pytest.mark.parametrize("damage, why", [(truncate, "truncated"), (flip_a_byte, "hash")])
def test_a_damaged_file_is_refused_and_removed(tiny, saved, tmp_path, caplog, damage, why):
    folder = damaged_copy(saved, tmp_path, damage)
    reply, warnings = follow_up(tiny[0], folder, saved[1], caplog)
    assert reply.stats.prompt_restored_tokens == 0  # a cold prefill
    assert reply.token_ids == saved[2].token_ids
    assert any("refused" in w and why in w for w in warnings), warnings
    assert not (folder / files(saved[0])[0].name).exists()  # the damaged file is gone


def test_another_models_file_is_refused(tiny, saved, tmp_path, caplog):
    """Model a's state, renamed as model b's (same shape: llama.cpp would take it) would be."""
    from edgespec.core.prompt_disk import _hash
    from edgespec.paths import model_identity
    folder = damaged_copy(saved, tmp_path, lambda p: None)
    source = files(folder)[0]
    renamed = folder / (_hash(model_identity(tiny[1]))[:12] + source.name[12:])
    source.rename(renamed)
    reply, warnings = follow_up(tiny[1], folder, saved[1], caplog)
    assert reply.stats.prompt_restored_tokens == 0
    assert any("another model" in w for w in warnings), warnings
    assert not renamed.exists()


def test_a_state_of_another_context_size_is_not_used(tiny, saved, tmp_path, caplog):
    folder = damaged_copy(saved, tmp_path, lambda p: None)
    reply, warnings = follow_up(tiny[0], folder, saved[1], caplog, n_ctx=2048)
    assert reply.stats.prompt_restored_tokens == 0
    assert any("ctx=1024 there, ctx=2048 here" in w for w in warnings), warnings
    assert reply.token_ids == saved[2].token_ids


def test_a_budget_too_small_keeps_nothing_and_says_so(tmp_path, caplog):
    from ggufs import tiny_llama_weights, write_tiny_llama_gguf
    wide = write_tiny_llama_gguf(tmp_path / "wide.gguf", tiny_llama_weights(
        n_embd=256, n_layer=4, n_head=4, n_head_kv=4, n_ff=256), n_head=4, n_head_kv=4)
    folder = tmp_path / "saved"
    with caplog.at_level(logging.WARNING, logger="edgespec.cache"):
        engine = edgespec.load(str(wide), draft="lookup", num_draft=4, n_ctx=512, cache_dir=folder,
                               cache_disk=1)
        engine.generate(PROMPT, GREEDY, max_tokens=4)  # 4 KiB of state a token: over 1 MiB
        engine.close()
    assert not files(folder) and folder_bytes(folder) == 0
    assert any("does not fit --cache-disk" in r.getMessage() for r in caplog.records)


def test_a_full_disk_leaves_no_part_file_and_the_engine_goes_on(tiny, tmp_path, caplog):
    """The process may write no file over 8 KiB (RLIMIT_FSIZE): the disk says EFBIG, as a
    full one says ENOSPC."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    engine = tiny_engine(tiny[0], tmp_path)
    engine.generate(PROMPT, GREEDY, max_tokens=4)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (2**13, hard))
        with caplog.at_level(logging.WARNING, logger="edgespec.cache"):
            engine.close()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert any("could not save a prompt state" in r.getMessage() for r in caplog.records)
    assert not files(tmp_path) and not list(tmp_path.glob("*" + PARTIAL))


WRITER = """
import os, sys
import numpy as np
from edgespec.core.prompt_disk import PromptDisk
folder, who, budget = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
disk = PromptDisk(folder, budget)
rng = np.random.default_rng(who)
for i in range(24):
    tokens = [who, i] + list(range(100))
    assert disk.write("model|ctx=1", tokens, len(tokens), rng.integers(0, 255, 700_000, dtype=np.uint8))
"""


def test_two_processes_writing_at_once_keep_the_folder_whole_and_in_budget(tmp_path):
    budget = 5 * 2**20
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(who), str(budget)])
               for who in (1, 2)]
    assert [w.wait(timeout=120) for w in writers] == [0, 0]
    assert folder_bytes(tmp_path) <= budget
    assert not list(tmp_path.glob("*" + PARTIAL))
    disk = PromptDisk(tmp_path, budget)
    entries = list(disk._entries("model"))
    assert len(entries) >= 4  # the newest of each writer's
    for entry in entries:  # every file there reads back whole and checked
        assert disk.read(entry) is not None
    assert disk.refused == 0


KILLED = """
import os, sys
import numpy as np
from edgespec.core import prompt_disk
def stuck(src, dst):  # the state is written; the rename never comes
    print("written", flush=True)
    os.kill(os.getpid(), 19)  # SIGSTOP: held here until killed
prompt_disk.os.replace = stuck
disk = prompt_disk.PromptDisk(sys.argv[1], 64 * 2**20)
disk.write("model|ctx=1", list(range(300)), 300, np.ones(3_000_000, dtype=np.uint8))
"""


def test_a_process_killed_during_a_write_leaves_nothing_that_is_read(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", KILLED, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "written"
    child.kill()
    child.wait(timeout=30)
    assert len(list(tmp_path.glob("*" + PARTIAL))) == 1 and not files(tmp_path)
    disk = PromptDisk(tmp_path, 64 * 2**20)
    assert disk.best("model|ctx=1", list(range(300))) == (None, 0)
    assert disk.write("model|ctx=1", list(range(200)), 200, np.zeros(1000, dtype=np.uint8))
    assert not list(tmp_path.glob("*" + PARTIAL))  # the dead writer's part file is removed
    assert len(files(tmp_path)) == 1


def test_the_least_recently_used_file_goes_first(tmp_path):
    disk = PromptDisk(tmp_path, 3 * 2**20 + 100_000)
    state = np.zeros(2**20, dtype=np.uint8)
    for first in (1, 2, 3):
        assert disk.write("m|s", [first] * 80, 80, state)
    entry, n = disk.best("m|s", [1] * 80)
    assert n == 80 and disk.read(entry) is not None  # 1 used again: 2 is now the oldest
    assert disk.write("m|s", [4] * 80, 80, state)
    held = sorted(e.tokens[0] for e in disk._entries("m"))
    assert held == [1, 3, 4] and folder_bytes(tmp_path) <= disk.budget
    assert disk.write("m|s", [1] * 120, 120, state)  # the same conversation, longer: replaces it
    assert sorted(e.tokens[0] for e in disk._entries("m")) == [1, 3, 4]
    assert [len(e.tokens) for e in disk._entries("m") if e.tokens[0] == 1] == [120]


def test_a_file_gone_since_it_was_listed_is_a_miss_that_keeps_the_cache(tiny_gguf_pair, tmp_path):
    target, _ = tiny_gguf_pair
    shared = PromptCache(0, min_tokens=4, disk=PromptDisk(tmp_path, 2**30))
    first = [1, 4, 9, 3, 12, 7, 2, 8] * 4
    writer = CachedModel(LlamaCppBackend(target, n_ctx=256), shared)
    writer.forward(first)
    assert writer.keep() and len(files(tmp_path)) == 1
    cache = CachedModel(LlamaCppBackend(target, n_ctx=256), shared)
    cache.forward(first[:8] + [5] * 8)
    real_read = shared.disk.read

    def removed_meanwhile(entry):  # another process evicts it between the listing and the read
        entry.path.unlink()
        return real_read(entry)
    shared.disk.read = removed_meanwhile
    assert cache.reuse(first + [3]) == (8, 0)  # the 8 tokens it held are kept, nothing restored
    assert cache.tokens == first[:8] and cache.backend.n_past == 8


def test_bad_folder_and_budget_are_clear_errors(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(edgespec.EdgespecError, match="cache-dir"):
        PromptDisk(blocker / "sub", 2**20)
    with pytest.raises(edgespec.EdgespecError, match="cache-disk"):
        edgespec.load("whatever.gguf", cache_dir=tmp_path, cache_disk=-1)


def test_a_restarted_server_restores_a_conversation_of_its_page(smollm2_path, tmp_path):
    """The page's conversation (or any client's) after `edgespec serve` is restarted."""
    import httpx
    from test_server import RunningServer
    messages = conversation()
    engine = load(smollm2_path, tmp_path)
    running = RunningServer(engine)
    first = httpx.post(running.url + "/v1/chat/completions",
                       json={"messages": messages, "max_tokens": 8}, timeout=120).json()
    running.stop()
    engine.close()  # (as `edgespec serve` does when it stops)
    follow = messages + [first["choices"][0]["message"], {"role": "user", "content": "Thanks."}]
    engine = load(smollm2_path, tmp_path)
    running = RunningServer(engine)
    try:
        reply = httpx.post(running.url + "/v1/chat/completions",
                           json={"messages": follow, "max_tokens": 8}, timeout=120).json()
        timings = reply["timings"]
        assert timings["cache_restored_n"] > 0.9 * reply["usage"]["prompt_tokens"]
        assert timings["prompt_n"] < 0.1 * reply["usage"]["prompt_tokens"]
        metrics = httpx.get(running.url + "/metrics").text
        assert "edgespec:prompt_cache_disk_hits_total 1.0" in metrics
    finally:
        running.stop()
        engine.close()
