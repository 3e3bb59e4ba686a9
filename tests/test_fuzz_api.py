"""Issue 15: the public API under random bad inputs and orderings.

Drives ``edgespec.load`` (the tiny GGUF pair on the real llama.cpp),
``Engine.generate/stream/chat/cancel/configure/tokenize``, ``ChatSession``
(``send``, ``save``, ``load``) and the chat's commands with a few hundred
random calls, good and bad, mixed with half-read streams and cancels. Every
call must either work or raise ``EdgespecError``/``ValueError`` (anything
else is a bug a desktop app would see as a crash), and afterwards the engine
must give the same greedy generation as a fresh one. The seed is fixed, so
a failure names a case that can be replayed.
"""

from __future__ import annotations

import io
import json
import math
import random

import pytest

import edgespec
from edgespec import EdgespecError, SamplingParams
from edgespec.cli.chat import _command
from edgespec.session import ChatSession

from ggufs import perturbed, tiny_llama_weights, write_tiny_llama_gguf

CASES = 300
GOOD_PROMPT = [1, 3, 4, 5, 6]
GREEDY = SamplingParams(temperature=0)

PROMPTS = [GOOD_PROMPT, [3], [], [-1, 3], [3, 16], [3, 10 ** 9], [3.0, 4], [True, 3], "abc",
           "", "\u00e9\u4e2d\U0001F600", None, {"a": 1}, 42, b"abc", "x" * 5000, [3] * 600]
TEMPERATURES = [0, 0.7, 1.5, -1, "0.7", None, math.nan, math.inf, 1e-320]
TOP_KS = [0, 3, -2, 2.5, "5", None]
TOP_PS = [1.0, 0.5, 0.0, 1.5, math.nan]
MAX_TOKENS = [1, 6, 30, 0, -3, 1.5, None, "4", True]
MESSAGES = [
    [{"role": "user", "content": "ab"}],
    [{"role": "system", "content": "s"}, {"role": "user", "content": "ba"}],
    "hello", None, [], ["ab"], [{"role": "user"}], [{"role": "user", "content": None}],
    [{"role": None, "content": "x"}], [{"role": "user", "content": {"nested": []}}],
]
TRANSCRIPTS = [
    {"messages": [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "ba"}]},
    {"messages": [{"role": "user", "content": None}]}, {"messages": "x"}, [], None,
    {"messages": [{"role": "wizard", "content": "x"}]}, {"messages": [], "system": 5},
    "[" * 100000, "{not json",
]
COMMANDS = ["/help", "/stats", "/reset", "/set temp 0.5", "/set temp abc", "/set top_k -1",
            "/set top_p 2", "/set num_draft 0", "/set num_draft 2", "/set num_draft x",
            "/set max_tokens 1.5", "/set max_tokens 8", "/set", "/set bogus 1", "/draft maybe",
            "/draft off", "/draft on", "/system be brief", "/bogus", "/save", "/load",
            "/save {dir}", "/load {dir}", "/load {missing}", "/save {file}", "/load {file}"]


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """A tiny pair whose vocabulary has byte tokens, so that any text can be tokenized."""
    folder = tmp_path_factory.mktemp("fuzz")
    weights = tiny_llama_weights(vocab_size=3 + 256 + 16, seed=7, eos_logit_scale=0.3)
    target = str(write_tiny_llama_gguf(folder / "target.gguf", weights, byte_tokens=True))
    draft = str(write_tiny_llama_gguf(folder / "draft.gguf", perturbed(weights, scale=0.3, seed=8),
                                      byte_tokens=True))
    fuzzed = edgespec.load(target, draft=draft, num_draft=3)
    fresh = edgespec.load(target, draft=draft, num_draft=3)
    yield fuzzed, fresh
    fuzzed.close()
    fresh.close()


def sampling(rng: random.Random) -> dict:
    options = {}
    for name, values in (("temperature", TEMPERATURES), ("top_k", TOP_KS), ("top_p", TOP_PS)):
        if rng.random() < 0.5:
            options[name] = rng.choice(values)
    options["max_tokens"] = rng.choice(MAX_TOKENS)
    return options


def one_case(rng: random.Random, engine, session: ChatSession, folder) -> str:
    """Run one random call; return what it did (for the failure message)."""
    kind = rng.choice(["generate", "stream", "chat", "cancel", "tokenize", "configure",
                       "send", "transcript", "command"])
    if kind == "generate":
        prompt, options = rng.choice(PROMPTS), sampling(rng)
        engine.generate(prompt, **options)
        return f"generate({prompt!r:.40}, {options})"
    if kind == "stream":
        stream = engine.stream(rng.choice(PROMPTS[:3]), GREEDY, max_tokens=rng.choice([5, 40]))
        read = rng.randrange(4)
        for i, _ in enumerate(stream):
            if i + 1 == read:
                if rng.random() < 0.5:
                    engine.cancel()
                else:
                    break
        stream.close()
        return f"stream(read {read})"
    if kind == "chat":
        messages = rng.choice(MESSAGES)
        list(engine.chat(messages, max_tokens=rng.choice([1, 8]), temperature=rng.choice([0, 0.8])))
        return f"chat({messages!r:.60})"
    if kind == "cancel":
        stream = engine.stream(GOOD_PROMPT, GREEDY, max_tokens=20)
        engine.cancel()  # before the first chunk: the generation ends at once
        chunks = list(stream)
        assert chunks[-1].finish_reason == "cancelled" and not chunks[-1].stats.generated_tokens
        return "cancel before the first chunk"
    if kind == "tokenize":
        prompt = rng.choice(PROMPTS)
        engine.tokenize(prompt)
        return f"tokenize({prompt!r:.40})"
    if kind == "configure":
        k = rng.choice([1, 3, 0, -1, 2.5, "x", None, "auto"] if rng.random() < 0.1 else [1, 3, 0, "x"])
        try:
            engine.configure(engine.drafter, k)
        finally:
            if engine.num_draft != 3:
                engine.configure(engine.drafter, 3)  # keep comparing like with like
        return f"configure(k={k!r})"
    if kind == "send":
        text = rng.choice(["ab", "", "   ", "ba ab", "x" * 3000, "\u00e9"])
        stream = session.send(text)
        for i, _ in enumerate(stream):
            if i == 2 and rng.random() < 0.3:
                break
        stream.close()
        return f"send({text!r:.20})"
    if kind == "transcript":
        path = folder / "t.json"
        data = rng.choice(TRANSCRIPTS)
        path.write_text(data if isinstance(data, str) else json.dumps(data))
        before = list(session.messages)
        try:
            session.load(path)
        except EdgespecError:
            assert session.messages == before  # a bad file changes nothing
            raise
        return f"load transcript {str(data)[:40]}"
    line = rng.choice(COMMANDS).format(dir=folder, missing=folder / "nope.json", file=folder / "s.json")
    _command(session, line, io.StringIO())
    return f"command {line}"


def test_random_misuse_only_raises_clear_errors_and_leaves_the_engine_exact(engines, tmp_path,
                                                                           monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))  # where auto mode's costs go
    engine, fresh = engines
    rng = random.Random(20261130)
    session = ChatSession(engine, params=SamplingParams(temperature=0), max_tokens=12)
    outcomes = {"ok": 0, "refused": 0}
    for case in range(CASES):
        state = rng.getstate()
        try:
            one_case(rng, engine, session, tmp_path)
            outcomes["ok"] += 1
        except (EdgespecError, ValueError) as exc:
            outcomes["refused"] += 1
            assert str(exc), f"case {case}: an error without a message"
        except Exception as exc:  # noqa: BLE001 - this is what the test looks for
            rng.setstate(state)
            raise AssertionError(f"case {case} raised {type(exc).__name__}: {exc}") from exc
        if case % 50 == 49:  # the engine still gives exactly what a fresh one gives
            engine.configure(engine.drafter, 3)
            assert engine.generate(GOOD_PROMPT, GREEDY, max_tokens=12).token_ids == \
                fresh.generate(GOOD_PROMPT, GREEDY, max_tokens=12).token_ids, f"after case {case}"
    # Both kinds of outcome happened a fair number of times: the fuzz reached both.
    assert outcomes["ok"] > CASES // 5 and outcomes["refused"] > CASES // 5, outcomes
    engine.configure(engine.drafter, 3)
    assert engine.generate(GOOD_PROMPT, GREEDY, max_tokens=20).token_ids == \
        fresh.generate(GOOD_PROMPT, GREEDY, max_tokens=20).token_ids


# -- llama-server's native endpoints, over HTTP --------------------------------------------

NATIVE_CASES = 150
COMPLETION_FIELDS = {
    "prompt": PROMPTS, "n_predict": [1, 6, -1, 0, -3, 1.5, None, "4", True],
    "max_tokens": [None, -1, 4, 0], "temperature": TEMPERATURES, "top_k": TOP_KS,
    "top_p": TOP_PS, "min_p": [0.0, 0.05, 1.0, -0.1, None], "seed": [None, 0, 7, -1, -2, "x", 2 ** 70],
    "stop": [None, "\n", ["a", "b"], [], [""], [1], ["s"] * 100, {"x": 1}],
    "stream": [True, False, None, "yes"], "cache_prompt": [True, False, "no"],
    "return_tokens": [True, False, 1], "mirostat": [0, 2, None], "model": ["x", 5, None],
    "speculative": [None, {"drafter": "off"}, {"drafter": "model"}, {"drafter": "nope"},
                    {"num_draft": 2}, {"num_draft": 0}, "fast"],
}
# llama-server's sampling fields, taken on every route.
LLAMA_FIELDS = {
    "repeat_penalty": [1.0, 1.2, 0, -1, "x", None, 1e9], "repeat_last_n": [64, 0, -1, -2, 1.5, "8"],
    "typical_p": [1.0, 0.5, 0, 1.5, None, "0.5"], "n_probs": [0, 3, 21, -1, "2"],
    "grammar": ["", "root ::= \"a\"", "root ::= (", 5, None],
    "json_schema": [None, {}, {"type": "object", "properties": {"a": {"type": "integer"}}}, {"type": 5}, "x"],
    "samplers": [None, "kt", "tk", "kzt", ["top_k", "temperature"], ["min_p", "top_p"], 5, ["nope"],
                 "ekypmt", ["infill"]],
    "xtc_probability": [0, 0.5], "dry_multiplier": [0, 1.0], "speculative.n_max": [None, 2, 0, "x"],
    "cache_prompt": [True, False, "no"], "top_k": [0, 5, -1], "min_p": [0.0, 0.1, 2],
}
COMPLETION_FIELDS.update(LLAMA_FIELDS)
TOKENIZE_FIELDS = {"content": PROMPTS, "add_special": [True, False, 1, None],
                   "parse_special": [True, False, "x"], "with_pieces": [True, False, 0]}
DETOKENIZE_TOKENS = [[1, 2, 3], [], [-1], [300], [10 ** 9], "abc", [1.5], None, [True], [3] * 600]
BODIES = [None, [], "x", 5, [{"prompt": "a"}]]  # not an object


def native_case(rng: random.Random, url: str) -> tuple[str, object, "httpx.Response"]:
    """One random call to a native endpoint: (path, body, response), the stream read."""
    import httpx
    path = rng.choice(["/completion", "/completions", "/completion", "/tokenize", "/detokenize",
                       "/props", "/metrics"])
    if path in ("/props", "/metrics"):
        return path, None, httpx.get(url + path, timeout=60)
    fields = {"/tokenize": TOKENIZE_FIELDS}.get(path, COMPLETION_FIELDS)
    if rng.random() < 0.05:
        body = rng.choice(BODIES)
    elif path == "/detokenize":
        body = {"tokens": rng.choice(DETOKENIZE_TOKENS)}
    else:
        body = {name: rng.choice(values) for name, values in fields.items()  # (llama-server's
                if name in ("prompt", "content") or rng.random() < (0.06 if name in LLAMA_FIELDS else 0.3)}
        if path != "/tokenize" and body.get("n_predict") in (-1, None) and \
                body.get("max_tokens") in (-1, None):
            body["n_predict"] = 8  # (no limit would fill the tiny model's long context: slow)
    with httpx.stream("POST", url + path, content=json.dumps(body, default=str), timeout=60,
                      headers={"Content-Type": "application/json"}) as reply:  # (NaN too)
        reply.read()
    return path, body, reply


def test_random_requests_to_the_native_endpoints_get_200_or_a_400_naming_the_field(engines):
    from test_server import RunningServer
    engine, fresh = engines
    running = RunningServer(engine, num_draft=3)
    rng = random.Random(20261201)
    statuses = {200: 0, 400: 0}
    try:
        for case in range(NATIVE_CASES):
            path, body, reply = native_case(rng, running.url)
            where = f"case {case}: {path} {json.dumps(body, default=str)[:200]} -> {reply.status_code} {reply.text[:300]}"
            assert reply.status_code in statuses, where
            statuses[reply.status_code] += 1
            if reply.status_code == 400:
                error = reply.json()["error"]
                assert set(error) == {"message", "type", "param", "code"} and error["message"], where
                assert error["param"] or not isinstance(body, dict), where  # it names the field
            elif reply.headers["content-type"].startswith("text/event-stream"):
                events = [json.loads(line[5:]) for line in reply.text.splitlines() if line.startswith("data:")]
                assert events and events[-1]["stop"] is True and "timings" in events[-1], where
        assert statuses[200] > NATIVE_CASES // 5 and statuses[400] > NATIVE_CASES // 5, statuses
        # The engine still gives exactly what a fresh one gives.
        import httpx
        reply = httpx.post(running.url + "/completion", json={"prompt": GOOD_PROMPT, "n_predict": 12,
                                                               "return_tokens": True}, timeout=60)
        engine.configure(engine.drafter, 3)
        assert reply.json()["tokens"] == fresh.generate(GOOD_PROMPT, GREEDY, max_tokens=12).token_ids
    finally:
        running.stop()


# -- the OpenAI fields that change what a reply must be -------------------------------------

CHAT_CASES = 100
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
CHAT_FIELDS = {
    "messages": MESSAGES + [[{"role": "tool", "content": "1", "tool_call_id": "c"}],
                            [{"role": "assistant", "content": None, "tool_calls": "x"}]],
    "max_tokens": [4, 8, 0, 12], "temperature": [0, 0.7, -1],
    "response_format": [None, {"type": "text"}, {"type": "json_object"}, {"type": "xml"}, "json",
                        {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}},
                        {"type": "json_schema", "json_schema": {"schema": {"type": 5}}},
                        {"type": "json_schema", "json_schema": {"schema": SCHEMA, "strict": True}}],
    "tools": [None, [], "x", [{"type": "function", "function": {"name": "f"}}], [{"type": "function"}]],
    "tool_choice": [None, "auto", "none", "required", {"type": "function", "function": {"name": "g"}}, 5],
    "logprobs": [None, True, False, "yes"], "top_logprobs": [None, 0, 2, 21, -1, "3"],
    "logit_bias": [None, {}, {"3": 5}, {"3": 101}, {"x": 1}, {"99999": 1}, [1], {"4": "a"}],
    "presence_penalty": [None, 0, 1.5, 2.5, "1", math.nan],
    "frequency_penalty": [None, 0, -1, -2.5, True],
    "prediction": [None, {"type": "content", "content": "abc"}, {"type": "content", "content": 5},
                   {"type": "text"}, "abc", {"type": "content", "content": [{"type": "text", "text": "a"}]}],
    "n": [None, 1, 2], "parallel_tool_calls": [True, False, "no", None],
    **LLAMA_FIELDS,
}


def test_random_chat_requests_with_the_openai_fields_get_200_or_a_400_naming_the_field(engines):
    pytest.importorskip("llguidance")
    import httpx
    from test_server import RunningServer
    engine, fresh = engines
    running = RunningServer(engine, num_draft=3)
    rng = random.Random(20261204)
    statuses = {200: 0, 400: 0}
    try:
        for case in range(CHAT_CASES):
            body = {name: rng.choice(values) for name, values in CHAT_FIELDS.items()
                    if name != "messages" and rng.random() < (0.04 if name in LLAMA_FIELDS else 0.2)
                    and values is not None}  # (llama-server's fields: a few at a time, most are 400s)
            body = {k: v for k, v in body.items() if v is not None}
            body["messages"] = rng.choice(CHAT_FIELDS["messages"]) if rng.random() < 0.2 \
                else [{"role": "user", "content": "ab"}]
            body.setdefault("max_tokens", 8)  # (no limit would fill the tiny model's long context: slow)
            stream = rng.random() < 0.3
            with httpx.stream("POST", running.url + "/v1/chat/completions", timeout=60,
                              content=json.dumps({**body, "stream": stream}, default=str),
                              headers={"Content-Type": "application/json"}) as reply:
                reply.read()
            where = f"case {case}: {json.dumps(body, default=str)[:300]} -> {reply.status_code} {reply.text[:300]}"
            assert reply.status_code in statuses, where
            statuses[reply.status_code] += 1
            if reply.status_code == 400:
                error = reply.json()["error"]
                assert error["message"] and error["param"], where  # it names the field
        assert statuses[200] > CHAT_CASES // 8 and statuses[400] > CHAT_CASES // 4, statuses
        engine.configure(engine.drafter, 3)
        reply = httpx.post(running.url + "/v1/completions", json={"prompt": GOOD_PROMPT, "max_tokens": 12,
                                                                  "temperature": 0, "logprobs": 1}, timeout=60)
        expected = fresh.generate(GOOD_PROMPT, GREEDY, max_tokens=12)
        assert reply.json()["choices"][0]["text"] == expected.text  # the engine is still exact
    finally:
        running.stop()
