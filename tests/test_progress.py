"""Prompt progress where people look: the Python API's callback, llama-server's
``prompt_progress`` events (``return_progress``) read with httpx from a real server,
and ``edgespec chat`` in a pseudo-terminal, whose progress line shows on a long prompt
and whose ``/load`` of a saved conversation, after a restart, restores its prompt.
(The chat page's bar: tests/test_chat_page.py, in a real browser.)"""

from __future__ import annotations

import json
import os
import re
import signal
import sys

import httpx
import pexpect
import pytest

import edgespec
from edgespec.core.cache import PREFILL_CHUNK
from edgespec.core.prompting import chat_prompt_ids
from edgespec.core.sampling import SamplingParams

from test_prompt_disk import conversation
from test_server import RunningServer

GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def engine(smollm2_path):
    engine = edgespec.load(str(smollm2_path), draft="lookup", num_draft=4, n_ctx=2048)
    yield engine
    engine.close()


def check_progress(events: list[dict], total: int) -> None:
    """llama-server's shape: processed from what was cached up to the total, never back."""
    assert events, "no progress was reported"
    assert all(e["total"] == total for e in events)
    assert events[0]["processed"] == events[0]["cache"]
    processed = [e["processed"] for e in events]
    assert processed == sorted(processed) and processed[-1] == total
    times = [e["time_ms"] for e in events]
    assert times == sorted(times)


def test_the_api_reports_each_pass_and_a_cancel_there_stops_the_prompt(engine):
    ids = chat_prompt_ids(engine.target, conversation(turns=4, functions=30))
    engine.target_cache.rewind(0)
    seen = []
    reply = engine.generate(ids, GREEDY, max_tokens=4,
                            progress=lambda p: seen.append({"total": p.total, "cache": p.cache,
                                                            "processed": p.processed,
                                                            "time_ms": p.seconds * 1000}))
    check_progress(seen, len(ids))
    # A report after each pass, and the passes end at multiples of the chunk.
    assert [e["processed"] for e in seen[1:-2]] == list(range(PREFILL_CHUNK, len(ids) - 1, PREFILL_CHUNK))
    assert reply.stats.prompt_eval_tokens == len(ids)

    engine.target_cache.rewind(0)
    stream = engine.stream(ids, GREEDY, max_tokens=4, progress=lambda p: engine.cancel())
    chunks = list(stream)
    assert chunks[-1].finish_reason == "cancelled" and not any(c.token_ids for c in chunks)
    again = engine.generate(ids, GREEDY, max_tokens=4)  # consistent: the same reply
    assert again.token_ids == reply.token_ids


def sse(response) -> list[dict]:
    return [json.loads(line[6:]) for line in response.text.split("\n")
            if line.startswith("data: {")]


def test_return_progress_streams_prompt_progress_on_every_route(engine):
    running = RunningServer(engine)
    messages = conversation(turns=4, functions=30)
    total = len(chat_prompt_ids(engine.target, messages))
    try:
        engine.target_cache.rewind(0)
        body = {"messages": messages, "max_tokens": 4, "stream": True, "return_progress": True}
        events = sse(httpx.post(running.url + "/v1/chat/completions", json=body, timeout=120))
        progress = [e["prompt_progress"] for e in events if "prompt_progress" in e]
        check_progress(progress, total)
        assert progress[0]["cache"] == 0 and len(progress) >= 4  # start, a pass of 512, the rest, the end
        for event in events:
            if "prompt_progress" in event:  # llama-server's: an empty assistant delta
                assert event["choices"][0]["delta"] == {"role": "assistant", "content": None}
        assert events[-1]["timings"]["prompt_n"] == total

        # Sent again, the prompt is cached: progress starts (and ends) near the total.
        events = sse(httpx.post(running.url + "/v1/chat/completions", json=body, timeout=120))
        progress = [e["prompt_progress"] for e in events if "prompt_progress" in e]
        check_progress(progress, total)
        assert progress[0]["cache"] >= total - 1

        # llama-server's /completion, the same prompt as text.
        prompt = engine.target.apply_chat_template(messages)
        native = {"prompt": prompt, "n_predict": 4, "stream": True, "return_progress": True,
                  "cache_prompt": False}
        events = sse(httpx.post(running.url + "/completion", json=native, timeout=120))
        progress = [e["prompt_progress"] for e in events if "prompt_progress" in e]
        check_progress(progress, progress[0]["total"])
        assert progress[0]["cache"] == 0 and events[-1]["stop"] is True

        # Without return_progress, or not streamed: no progress.
        quiet = sse(httpx.post(running.url + "/v1/chat/completions",
                               json={**body, "return_progress": False}, timeout=120))
        assert not any("prompt_progress" in e for e in quiet)
        whole = httpx.post(running.url + "/v1/chat/completions", json={**body, "stream": False},
                           timeout=120).json()
        assert "prompt_progress" not in whole and whole["choices"][0]["message"]["content"]
    finally:
        running.stop()


STATS = re.compile(r"\[(\d+) tokens, [\d.]+ tok/s.*?prompt eval (\d+)/(\d+) tokens(.*?)\]")


def chat(smollm2_path, folder):
    env = {**os.environ, "NO_COLOR": "1"}
    child = pexpect.spawn(sys.executable, ["-m", "edgespec", "chat", "-m", str(smollm2_path), "-d", "lookup",
                                           "--num-draft", "4", "--temp", "0", "-n", "8", "--ctx", "2048",
                                           "--cache-dir", str(folder), "--cache-disk", "256"],
                          env=env, encoding="utf-8", timeout=180, dimensions=(40, 200),
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    child.expect_exact("> ")
    return child


def test_chat_shows_progress_and_a_loaded_conversation_is_restored_after_a_restart(smollm2_path, tmp_path):
    transcript = tmp_path / "chat.json"
    transcript.write_text(json.dumps({"version": 1, "system": None, "messages": conversation(turns=4, functions=30)}))
    folder = tmp_path / "saved"

    child = chat(smollm2_path, folder)
    child.sendline(f"/load {transcript}")
    child.expect_exact("> ")
    child.sendline("Thanks!")
    child.expect(r"\(prompt: ([\d,]+) of ([\d,]+) tokens")  # the progress line
    total = int(child.match.group(2).replace(",", ""))
    assert total > PREFILL_CHUNK + 64
    child.expect(r"\(prompt: ([\d,]+) of [\d,]+ tokens, about \d+ s left\)")  # after a pass: the time left
    child.expect(STATS)
    assert int(child.match.group(2)) == int(child.match.group(3)) == total  # all of it evaluated
    child.expect_exact("> ")
    child.sendline("/quit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0

    child = chat(smollm2_path, folder)  # started again
    child.sendline(f"/load {transcript}")
    child.expect_exact("> ")
    child.sendline("Thanks!")
    child.expect(STATS)
    evaluated, prompt, rest = int(child.match.group(2)), int(child.match.group(3)), child.match.group(4)
    assert prompt == total and evaluated < 8
    assert re.search(r"(\d+) restored from saved prompts", rest)
    assert "(prompt:" not in child.before  # nothing long to wait for: no progress line
    child.expect_exact("> ")
    child.sendline("/quit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
