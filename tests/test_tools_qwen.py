"""Tool calling and structured output through ``edgespec serve`` on the Qwen2.5-Coder
pair (slow: 1.6 GB of weights), with the real ``openai`` client: a call, the tool's
result, the final answer, streamed and not; JSON schemas; a prediction drafted from."""

from __future__ import annotations

import json

import pytest

from edgespec import load
from json_schemas import SCHEMAS
from test_server import RunningServer

pytestmark = pytest.mark.slow
openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


@pytest.fixture(scope="module")
def served():
    engine = load("qwen2.5-coder-1.5b-instruct", draft="qwen2.5-coder-0.5b-instruct",
                  n_ctx=4096, num_draft="auto", fetch=True)
    running = RunningServer(engine)
    yield running
    running.stop()
    engine.close()


def create(served, **fields):
    fields.setdefault("max_tokens", 200)
    return served.client().chat.completions.create(
        model=served.settings.model_names[0], temperature=0, **fields)


def streamed_calls(stream) -> tuple[str, list[dict], str]:
    """The text, tool calls (assembled from their deltas) and finish reason of a stream."""
    text, calls, reason = "", {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        text += choice.delta.content or ""
        for delta in choice.delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            call["id"] += delta.id or ""
            call["name"] += delta.function.name or ""
            call["arguments"] += delta.function.arguments or ""
        reason = choice.finish_reason or reason
    return text, [calls[i] for i in sorted(calls)], reason


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice", ["auto", "required"])
def test_a_tool_round_trip(served, stream, choice):
    if stream:
        text, calls, reason = streamed_calls(create(served, messages=ASK, tools=[WEATHER],
                                                    tool_choice=choice, stream=True))
    else:
        reply = create(served, messages=ASK, tools=[WEATHER], tool_choice=choice)
        reason = reply.choices[0].finish_reason
        calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                 for c in reply.choices[0].message.tool_calls or []]
    assert reason == "tool_calls" and len(calls) >= 1
    assert calls[0]["name"] == "get_weather"
    assert "paris" in json.loads(calls[0]["arguments"])["city"].lower()
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": calls[0]["id"], "type": "function",
             "function": {"name": "get_weather", "arguments": calls[0]["arguments"]}}]},
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": '{"celsius": 17, "sky": "cloudy"}'}]
    final = create(served, messages=history, tools=[WEATHER], tool_choice="none")  # the answer now
    assert final.choices[0].finish_reason == "stop"
    assert "17" in final.choices[0].message.content


def test_a_named_function_is_called(served):
    reply = create(served, messages=[{"role": "user", "content": "Hello!"}], tools=[WEATHER],
                   tool_choice={"type": "function", "function": {"name": "get_weather"}})
    call = reply.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments)


def test_twenty_json_schemas_on_qwen(served):
    for i, (what, schema) in enumerate(SCHEMAS):
        reply = create(served, messages=[{"role": "user", "content": f"Reply with {what} as JSON."}],
                       response_format={"type": "json_schema", "json_schema": {
                           "name": f"s{i}", "schema": schema, "strict": True}})
        jsonschema.validate(json.loads(reply.choices[0].message.content), schema)


def test_a_prediction_is_mostly_accepted_on_an_edit(served):
    source = "\n".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(12))
    messages = [{"role": "user", "content": f"Rename f3 to g3 in this file and give the whole "
                                            f"file back, nothing else:\n```python\n{source}```"}]
    predicted = create(served, messages=messages, max_tokens=400,
                       extra_body={"prediction": {"type": "content", "content": source}})
    details = predicted.usage.completion_tokens_details
    assert 0 < details.accepted_prediction_tokens <= predicted.model_extra["timings"]["draft_n_accepted"]
    assert details.rejected_prediction_tokens >= 0
    # (How much faster: scripts/bench_predictions.py, a benchmark, not a timed test.)


CITIES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Sydney", "Toronto", "Nairobi", "Seoul", "Madrid"]


def calls_of(served, stream, **fields) -> list[dict]:
    if stream:
        return streamed_calls(create(served, stream=True, **fields))[1]
    reply = create(served, **fields)
    return [{"name": c.function.name, "arguments": c.function.arguments}
            for c in reply.choices[0].message.tool_calls or []]


def test_parallel_tool_calls_false_gives_exactly_one_call_in_twenty_requests(served):
    # Asked about two cities, the model calls twice where the grammar of "required" lets it.
    pairs = [(a, b) for a, b in zip(CITIES * 2, CITIES[3:] + CITIES[:3] + CITIES[7:] + CITIES[:7])]
    ask = lambda a, b: [{"role": "user", "content": f"What is the weather in {a} and in {b}?"}]  # noqa: E731
    assert len(calls_of(served, False, messages=ask(*pairs[0]), tools=[WEATHER], tool_choice="required")) >= 2
    ones = 0
    for i, (a, b) in enumerate(pairs):
        calls = calls_of(served, i % 2 == 1, messages=ask(a, b), tools=[WEATHER], tool_choice="required",
                         parallel_tool_calls=False)
        ones += len(calls) == 1 and calls[0]["name"] == "get_weather"
    assert ones == 20


def test_a_fenced_rename_picks_the_prediction_up_again(served):
    # The edit: the reply opens a fence and renames add, both absent from the
    # prediction; drafting resumes where the reply is back on it. (k fixed: whether auto
    # mode drafts on a 16-token reply is its cost model's call on the machine.)
    two = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
    ask = [{"role": "user", "content": "Rename the function add to plus. Reply with the changed "
                                       f"function in a ```python fence.\n```python\n{two}```"}]
    reply = create(served, messages=ask, max_tokens=64,
                   extra_body={"prediction": {"type": "content", "content": two},
                               "speculative": {"num_draft": 4}})
    assert "def plus(a, b):" in reply.choices[0].message.content
    assert reply.usage.completion_tokens_details.accepted_prediction_tokens >= 6
