"""The OpenAI fields that change what a reply must be, through a real ``edgespec serve``
(SmolLM2) and the real ``openai`` client: structured output, logprobs, logit bias,
penalties, predicted outputs, tools; and every refused field named in a 400."""

from __future__ import annotations

import json

import httpx
import pytest

import edgespec
from edgespec.core.grammar import closed
from json_schemas import SCHEMAS
from test_server import RunningServer

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")

ASK = [{"role": "user", "content": "Tell me about your favourite city."}]


@pytest.fixture(scope="module")
def served(smollm2_path):
    engine = edgespec.load(str(smollm2_path), draft="lookup", num_draft="auto", n_ctx=2048)
    running = RunningServer(engine)
    yield running
    running.stop()
    engine.close()


def chat(served, **fields):
    fields.setdefault("max_tokens", 160)
    return served.client().chat.completions.create(model=served.settings.model_names[0], temperature=0, **fields)


@pytest.mark.slow
def test_twenty_json_schemas_each_give_valid_json(served):
    valid = 0
    for i, (what, schema) in enumerate(SCHEMAS):
        strict = i % 2 == 0
        reply = chat(served, messages=[{"role": "user", "content": f"Reply with {what} as JSON."}],
                     response_format={"type": "json_schema", "json_schema": {
                         "name": f"schema{i}", "schema": schema if strict else closed(schema),
                         "strict": strict}})
        jsonschema.validate(json.loads(reply.choices[0].message.content), schema)
        valid += 1
    assert valid == len(SCHEMAS) == 20


def test_json_object_always_parses_streamed_or_not(served):
    for i, prompt in enumerate(["List two fruits.", "What is 2 + 2?", "Describe a cat."]):
        messages = [{"role": "user", "content": prompt}]
        if i % 2:
            stream = chat(served, messages=messages, response_format={"type": "json_object"}, stream=True)
            text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        else:
            text = chat(served, messages=messages, response_format={"type": "json_object"}
                        ).choices[0].message.content
        assert isinstance(json.loads(text), dict)


def test_logprobs_are_the_targets_for_each_token(served):
    reply = chat(served, messages=ASK, max_tokens=24, logprobs=True, top_logprobs=3)
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    assert "".join(c.token for c in content) == reply.choices[0].message.content
    for entry in content:
        tops = [t.logprob for t in entry.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and tops[0] <= 0
        assert entry.logprob == pytest.approx(tops[0], abs=1e-6)  # greedy: the argmax
    stream = chat(served, messages=ASK, max_tokens=24, logprobs=True, top_logprobs=3, stream=True)
    streamed = [e for c in stream if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in content]


def test_logit_bias_removes_a_token_and_penalties_apply_exactly(served):
    plain = chat(served, messages=ASK, max_tokens=40, logprobs=True)
    first = plain.choices[0].logprobs.content[0].token
    token = served.server.engine.target.tokenize(first, add_bos=False, special=False)[0]
    banned = chat(served, messages=ASK, max_tokens=40, logprobs=True, logit_bias={str(token): -100})
    assert token not in [served.server.engine.target.tokenize(e.token, add_bos=False, special=False)[0]
                         for e in banned.choices[0].logprobs.content]
    penalised = dict(messages=ASK, max_tokens=60, frequency_penalty=1.5, presence_penalty=0.5)
    spec = chat(served, **penalised)
    off = chat(served, **penalised, extra_body={"speculative": {"drafter": "off"}})
    assert spec.choices[0].message.content == off.choices[0].message.content
    assert spec.choices[0].message.content != chat(served, messages=ASK, max_tokens=60).choices[0].message.content


def test_a_prediction_is_drafted_from_and_counted(served):
    # The prediction is the reply itself (the model's own greedy text), drafted 4 at a
    # time (auto mode would weigh whether drafting pays on this machine: not tested here).
    messages = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
    text = chat(served, messages=messages, max_tokens=40).choices[0].message.content
    reply = chat(served, messages=messages, max_tokens=40,
                 extra_body={"prediction": {"type": "content", "content": text},
                             "speculative": {"num_draft": 4}})
    details = reply.usage.completion_tokens_details
    assert details.accepted_prediction_tokens > 0
    assert details.rejected_prediction_tokens >= 0
    assert reply.model_extra["timings"]["draft_n_accepted"] >= details.accepted_prediction_tokens


def test_a_template_without_tools_refuses_them(served):
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    with pytest.raises(openai.BadRequestError) as err:
        chat(served, messages=ASK, tools=tools)
    assert err.value.body["param"] == "tools"


@pytest.mark.parametrize("fields, param", [
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 7}}}},
     "response_format.json_schema"),
    ({"tools": [{"type": "function"}]}, "tools[0]"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"logit_bias": {"x": 1}}, "logit_bias"),
    ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"logit_bias": {"99999999": 1}}, "logit_bias"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"frequency_penalty": "a"}, "frequency_penalty"),
    ({"logprobs": "yes"}, "logprobs"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"prediction": {"type": "text"}}, "prediction"),
    ({"prediction": {"type": "content", "content": "x"}, "logprobs": True}, "logprobs"),
    ({"prediction": {"type": "content", "content": "x"}, "frequency_penalty": 1}, "frequency_penalty"),
    ({"response_format": {"type": "json_object"}, "tools": [
        {"type": "function", "function": {"name": "f"}}], "tool_choice": "required"}, "response_format"),
])
def test_bad_fields_are_refused_by_name(served, fields, param):
    body = {"model": served.settings.model_names[0], "messages": ASK, "max_tokens": 4, **fields}
    reply = httpx.post(served.url + "/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param
