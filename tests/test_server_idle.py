"""Issue 66: nothing slow inside a request that the user did not ask for.

A drafter named for the first time (auto mode over a draft model the engine has not
timed, on a fresh ``$EDGESPEC_HOME``) drafts from what is kept in its request; its
calibration runs once the server is idle, and keeps the conversation in the caches.
The event loop answers ``/health`` at once while a long generation runs.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

import edgespec
from edgespec.planner import calibration

from test_server import HELLO, RunningServer
from test_server_access import metric


@pytest.fixture
def fresh_engine(smollm2_path, smollm2_q2k_path, tmp_path, monkeypatch):
    """SmolLM2 with its Q2_K copy at a fixed k: no auto planner made at load, and no
    costs kept anywhere (nor saved prompts: a follow-up reuses the KV cache or nothing)."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    engine = edgespec.load(str(smollm2_path), draft=str(smollm2_q2k_path), num_draft=4, n_ctx=1024,
                           cache_ram=0, cache_disk=0)
    yield engine
    engine.close()


def chat(url: str, messages: list, **extra) -> dict:
    reply = httpx.post(url + "/v1/chat/completions", timeout=300,
                       json={"messages": messages, "max_tokens": 12, **extra})
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_a_drafter_named_first_is_timed_when_idle_not_inside_its_request(fresh_engine):
    before_load = calibration.calibrations
    running = RunningServer(fresh_engine)
    try:
        running.server.idle_seconds = 5.0  # (the check below comes well before the server idles)
        first = chat(running.url, HELLO)
        messages = HELLO + [first["choices"][0]["message"],
                            {"role": "user", "content": "Now list three animals."}]
        before = calibration.calibrations
        assert before == before_load  # a fixed k times nothing
        auto = {"speculative": {"drafter": "model", "num_draft": "auto"}}
        second = chat(running.url, messages, **auto)
        assert calibration.calibrations == before  # none inside the request...
        reused = second["timings"]["cache_n"]
        assert reused >= first["usage"]["prompt_tokens"]  # ...and the target's cache kept
        # Idle now: the pair is calibrated (once), after the conversation the caches hold.
        assert running.server.timed_while_idle.wait(120), "no calibration while idle"
        assert metric(running.url, "edgespec:calibrations_total") == calibration.calibrations == before + 1
        assert not fresh_engine.planners.pending
        messages += [second["choices"][0]["message"], {"role": "user", "content": "And two birds."}]
        third = chat(running.url, messages, **auto)
        assert third["timings"]["cache_n"] >= second["usage"]["prompt_tokens"]
        assert calibration.calibrations == before + 1  # timed once: kept for the next
    finally:
        running.stop()


def test_health_answers_within_100_ms_during_a_400_token_generation(engine):
    running = RunningServer(engine)
    try:
        never_end = {str(t): -100 for t in engine.target.vocab.eos_token_ids}
        started, finished = threading.Event(), []

        def generate():
            with httpx.stream("POST", running.url + "/v1/completions", timeout=300, json={
                    "prompt": "Once upon a time", "max_tokens": 400, "stream": True,
                    "logit_bias": never_end}) as reply:
                for line in reply.iter_lines():
                    started.set()
                    finished.append(line)

        thread = threading.Thread(target=generate)
        thread.start()
        assert started.wait(120)
        latencies, busy = [], []
        with httpx.Client() as client:
            for _ in range(50):
                start = time.perf_counter()
                health = client.get(running.url + "/health").json()
                latencies.append(time.perf_counter() - start)
                busy.append(health["generating"])
        thread.join()
        assert all(busy), "the generation ended before the probes did: make it longer"
        assert sorted(latencies)[int(0.99 * len(latencies))] < 0.1, max(latencies)
    finally:
        running.stop()


@pytest.fixture(scope="module")
def engine(smollm2_path):
    engine = edgespec.load(str(smollm2_path), draft="lookup", num_draft=4, n_ctx=1024)
    yield engine
    engine.close()
