"""``edgespec serve``: a real server on a free port, SmolLM2 behind it, the real
``openai`` client (and httpx for what the client hides) in front of it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading

import httpx
import pytest

import edgespec
from edgespec import SamplingParams
from edgespec.serve.openai_api import ApiError
from edgespec.serve.server import ServerSettings, Turns, bind, create_app

openai = pytest.importorskip("openai")

SETTINGS = dict(defaults=SamplingParams(temperature=0), num_draft=4)
HELLO = [{"role": "user", "content": "List three colours, one per line."}]


class RunningServer:
    """uvicorn serving ``create_app(engine, settings)`` in a thread, on a socket that
    listens before the thread starts (so no client has to wait for it)."""

    def __init__(self, engine, **settings):
        import uvicorn
        names = (engine.target.name,)
        self.settings = ServerSettings(names, **{**SETTINGS, **settings})
        self.app = create_app(engine, self.settings)
        self.sock = bind("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.uvicorn = uvicorn.Server(uvicorn.Config(self.app, log_level="warning"))
        self.thread = threading.Thread(target=self.uvicorn.run, kwargs={"sockets": [self.sock]})
        self.thread.start()

    @property
    def server(self):
        return self.app.state.server

    def client(self, **options):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=options.pop("api_key", "none"),
                             max_retries=0, **options)

    def stop(self):
        self.uvicorn.should_exit = True
        self.thread.join()
        self.sock.close()


@pytest.fixture(scope="module")
def engine(smollm2_path):
    engine = edgespec.load(str(smollm2_path), draft="lookup", num_draft=4, n_ctx=1024)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def served(engine):
    running = RunningServer(engine)
    yield running
    running.stop()


def test_models_and_health(served):
    models = served.client().models.list()
    assert [m.id for m in models.data] == [served.settings.model_names[0]]
    assert httpx.get(served.url + "/health").json()["status"] == "ok"


def test_greedy_chat_equals_edgespec_generate(smollm2_path):
    """The first request of a fresh server runs exactly what `edgespec generate` runs."""
    engine = edgespec.load(str(smollm2_path), draft="lookup", num_draft=4, n_ctx=1024)
    running = RunningServer(engine)
    try:
        reply = running.client().chat.completions.create(
            model=running.settings.model_names[0], messages=HELLO, temperature=0, max_tokens=24)
    finally:
        running.stop()
        engine.close()
    cli = subprocess.run([sys.executable, "-m", "edgespec", "generate", "-m", str(smollm2_path),
                          "-d", "lookup", "--num-draft", "4", "--temp", "0", "-n", "24",
                          "--ctx", "1024", "-p", HELLO[0]["content"], "--json"],
                         capture_output=True, text=True, check=True)
    expected = json.loads(cli.stdout)
    assert reply.choices[0].message.content == expected["text"]
    assert reply.usage.completion_tokens == len(expected["token_ids"])
    assert reply.choices[0].finish_reason == ("length" if len(expected["token_ids"]) == 24 else "stop")
    timings = reply.model_extra["timings"]
    assert timings["predicted_n"] == reply.usage.completion_tokens
    assert timings["draft_n"] >= timings["draft_n_accepted"] >= 0
    assert timings["predicted_per_second"] > 0 and timings["prompt_n"] > 0


def test_streaming_chat_matches_the_whole_reply_and_ends_with_usage(served):
    client = served.client()
    whole = client.chat.completions.create(model=served.settings.model_names[0],
                                           messages=HELLO, temperature=0, max_tokens=20)
    chunks = list(client.chat.completions.create(
        model=served.settings.model_names[0], messages=HELLO, temperature=0, max_tokens=20,
        stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == whole.choices[0].finish_reason
    tokens = whole.usage.completion_tokens
    assert finals[0].model_extra["timings"]["predicted_n"] == tokens
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == tokens
    # One chunk per token (with text), each saying whether it was an accepted draft.
    assert all("from_draft" in c.choices[0].model_extra for c in chunks[1:-2])


def test_completions_stream_and_not(served):
    client = served.client()
    prompt = "The capital of France is"
    whole = client.completions.create(model=served.settings.model_names[0], prompt=prompt,
                                      temperature=0, max_tokens=12)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=served.settings.model_names[0], prompt=prompt, temperature=0, max_tokens=12,
        stream=True))
    assert streamed == whole.choices[0].text and whole.usage.completion_tokens == 12
    assert whole.model_extra["timings"]["predicted_n"] == 12


def test_per_request_speculation(served):
    client = served.client()
    off = client.chat.completions.create(model=served.settings.model_names[0], messages=HELLO,
                                         temperature=0, max_tokens=16,
                                         extra_body={"speculative": {"drafter": "off"}})
    assert off.model_extra["timings"]["draft_n"] == 0
    assert off.model_extra["timings"]["drafter"] == "none"
    fixed = client.chat.completions.create(
        model=served.settings.model_names[0], messages=HELLO, temperature=0, max_tokens=16,
        extra_body={"speculative": {"drafter": "lookup", "num_draft": 2}})
    assert fixed.model_extra["timings"]["drafter"] == "lookup"
    with pytest.raises(openai.BadRequestError, match="no draft model"):
        client.chat.completions.create(model=served.settings.model_names[0], messages=HELLO,
                                       extra_body={"speculative": {"drafter": "model"}})


def test_a_request_never_reconfigures_the_shared_engine(served, engine):
    """A request's drafter and k are arguments of its generation: the engine's own
    drafter, k and planner are what they were after requests that asked for others."""
    before = (engine.drafter, engine.num_draft, engine.planner)
    client = served.client()
    for speculative in ({"drafter": "off"}, {"drafter": "suffix", "num_draft": "auto"},
                        {"drafter": "lookup", "num_draft": 2}):
        reply = client.chat.completions.create(model=served.settings.model_names[0], messages=HELLO,
                                               temperature=0, max_tokens=8,
                                               extra_body={"speculative": speculative})
        assert reply.choices[0].message.content
        assert (engine.drafter, engine.num_draft, engine.planner) == before
    default = client.chat.completions.create(model=served.settings.model_names[0], messages=HELLO,
                                             temperature=0, max_tokens=8)
    assert default.model_extra["timings"]["drafter"] == engine.planner.name


def test_the_second_turn_evaluates_only_its_new_tokens(served, engine):
    client = served.client()
    messages = [{"role": "user", "content": "Name three fruits."}]
    first = client.chat.completions.create(model=served.settings.model_names[0], messages=messages,
                                           temperature=0, max_tokens=24)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "Now three vegetables, please."}]
    second = client.chat.completions.create(model=served.settings.model_names[0],
                                            messages=messages, temperature=0, max_tokens=8)
    new = len(engine.target.tokenize(messages[-1]["content"], add_bos=False))
    assert second.model_extra["timings"]["prompt_n"] <= new + 12  # the template's few tokens
    assert second.usage.prompt_tokens > 3 * second.model_extra["timings"]["prompt_n"]


def test_two_concurrent_clients_take_turns_and_both_are_right(served):
    client = served.client()
    prompts = [[{"role": "user", "content": "Count from one to ten."}],
               [{"role": "user", "content": "Say hello in French."}]]
    expected = [client.chat.completions.create(model=served.settings.model_names[0], messages=m,
                                               temperature=0, max_tokens=20).choices[0].message.content
                for m in prompts]
    results = [None, None]

    def ask(i):
        results[i] = client.chat.completions.create(
            model=served.settings.model_names[0], messages=prompts[i], temperature=0,
            max_tokens=20).choices[0].message.content

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == expected


def test_turns_are_fifo_and_bounded():
    async def scenario():
        turns, order, queued = Turns(1), [], asyncio.Event()
        await turns.acquire()  # a generation runs
        async def wait(name):
            queued.set()  # (acquire() counts the waiter before it first yields)
            await turns.acquire()
            order.append(name)
            turns.release()
        waiter = asyncio.ensure_future(wait("first"))
        await queued.wait()  # the waiter ran up to its wait for the turn
        assert turns.waiting == 1
        with pytest.raises(ApiError) as full:
            await turns.acquire()
        assert full.value.status == 503 and full.value.headers["Retry-After"]
        turns.release()
        await waiter
        assert order == ["first"] and not turns.busy
    asyncio.run(scenario())


def test_a_full_queue_answers_503_with_retry_after(tmp_path):
    # A tiny model that never ends by itself: the first generation runs for 3000 tokens,
    # long after the second request (sent the moment the first token arrives) is answered.
    from ggufs import tiny_llama_weights, write_tiny_llama_gguf
    path = write_tiny_llama_gguf(tmp_path / "endless.gguf", tiny_llama_weights(seed=3, eos_logit_scale=0.0),
                                 context_length=4096)
    engine = edgespec.load(str(path), num_draft=1, n_ctx=4096)
    running = RunningServer(engine, queue_size=0)
    try:
        body = {"prompt": [1, 3, 4], "max_tokens": 3000, "stream": True}
        with httpx.stream("POST", running.url + "/v1/completions", json=body) as holding:
            lines = holding.iter_lines()  # (kept: a dropped iterator closes the connection)
            next(lines)  # the first generation runs now
            refused = httpx.post(running.url + "/v1/completions", json={"prompt": [1, 3], "max_tokens": 4})
            assert running.server.turns.busy  # (still generating: the refusal was for a full queue)
        assert refused.status_code == 503 and refused.headers["retry-after"]
        assert refused.json()["error"]["code"] == "queue_full"
    finally:
        running.stop()
        engine.close()


def test_a_client_that_disconnects_cancels_its_generation(served):
    body = {"messages": [{"role": "user", "content": "Write a very long story about a ship."}],
            "max_tokens": 900, "stream": True, "temperature": 0.7, "seed": 1}
    with httpx.stream("POST", served.url + "/v1/chat/completions", json=body) as gone:
        for i, _ in enumerate(gone.iter_lines()):
            if i == 6:
                break  # the client goes away mid-stream
    after = served.client().chat.completions.create(model=served.settings.model_names[0],
                                                    messages=HELLO, temperature=0, max_tokens=4)
    assert after.usage.completion_tokens == 4
    reason, stats = list(served.server.finished)[-2]  # the abandoned one, finished before it
    assert reason == "cancelled" and stats.generated_tokens < 300


@pytest.mark.parametrize("body, status, param", [
    ({"messages": HELLO, "temperature": "hot"}, 400, "temperature"),
    ({"messages": HELLO, "max_tokens": 0}, 400, "max_tokens"),
    ({"messages": HELLO, "n": 2}, 400, "n"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role"),
    ({"messages": [{"role": "user", "content": None}]}, 400, "messages[0].content"),
    ({"messages": []}, 400, "messages"),
    ({"messages": [{"role": "user", "content": "word " * 1500}]}, 400, None),  # > the context
    ({"prompt": ""}, 400, "prompt"),
])
def test_errors_in_openai_shape(served, body, status, param):
    path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
    reply = httpx.post(served.url + path, json=body)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param:
        assert error["param"] == param
    assert "Traceback" not in reply.text
    if "context" in str(body):
        assert "context" in error["message"]


def test_not_json_and_unknown_routes_are_openai_errors(served):
    reply = httpx.post(served.url + "/v1/chat/completions", content=b"{nope",
                       headers={"Content-Type": "application/json"})
    assert reply.status_code == 400 and "JSON" in reply.json()["error"]["message"]
    missing = httpx.get(served.url + "/v1/nothing")
    assert missing.status_code == 404 and missing.json()["error"]["message"]


def test_an_api_key_is_required_when_set(engine):
    running = RunningServer(engine, api_key="s3cret")
    try:
        for key in ("none", "wrong"):
            with pytest.raises(openai.AuthenticationError):
                running.client(api_key=key).models.list()
        assert httpx.post(running.url + "/v1/chat/completions",
                          json={"messages": HELLO}).status_code == 401
        assert [m.id for m in running.client(api_key="s3cret").models.list().data]
        assert httpx.get(running.url + "/").status_code == 200  # the page itself is open
    finally:
        running.stop()


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell starts a background job


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_serve_command_warns_off_localhost_and_stops_cleanly_on_ctrl_c_or_sigterm(
        smollm2_path, tmp_path, stop):
    """Started with SIGINT ignored (a background job), the server still stops on it."""
    env = {**os.environ, "EDGESPEC_HOME": str(tmp_path)}
    process = subprocess.Popen(
        [sys.executable, "-m", "edgespec", "serve", "-m", str(smollm2_path), "-d", "lookup",
         "--host", "0.0.0.0", "--port", "0", "--ctx", "512", "--temp", "0"],
        stderr=subprocess.PIPE, text=True, env=env, preexec_fn=_ignore_sigint)
    try:
        lines = []
        for line in process.stderr:
            lines.append(line)
            if "http://" in line:  # printed once the socket listens
                break
        assert any("warning" in line and "--api-key" in line for line in lines), lines
        port = int(lines[-1].split("http://0.0.0.0:")[1].split()[0])
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/completions",
                           json={"prompt": "Hello", "max_tokens": 3}, timeout=60)
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 3
        process.send_signal(stop)
        _, rest = process.communicate(timeout=60)  # (a server that ignores it fails here)
        assert process.returncode == 0, rest
        assert "Traceback" not in rest and "server stopped" in rest  # (after the models were freed)
        # A line per request on stderr, as llama-server prints its timings.
        assert "completion: prompt " in rest and "decode 3 tokens" in rest, rest
    finally:
        if process.poll() is None:
            process.kill()
