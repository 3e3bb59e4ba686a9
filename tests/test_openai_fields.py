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


# -- the table of request fields (edgespec.serve.request_fields), row by row -----------------

from pathlib import Path  # noqa: E402

from edgespec.serve import request_fields  # noqa: E402
from edgespec.serve.llama_api import NativeCompletion  # noqa: E402
from edgespec.serve.openai_api import ChatBody, CompletionBody  # noqa: E402

ROUTE_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "native": "/completion"}
MODELS = {"chat": ChatBody, "completions": CompletionBody, "native": NativeCompletion}


def minimal(route):
    """The least body a route takes, a one-token reply."""
    return {"messages": ASK, "max_tokens": 1} if route == "chat" else {"prompt": "Hello", "max_tokens": 1}


def known(route) -> set[str]:
    """The names a route's body model reads (with their aliases)."""
    names = set()
    for name, info in MODELS[route].model_fields.items():
        names.add(info.alias or name)
        choices = getattr(info.validation_alias, "choices", None)
        names.update(choices or ([info.validation_alias] if isinstance(info.validation_alias, str) else [name]))
    return names


def rows(status):
    return [pytest.param(route, row, id=f"{route}-{row.name}") for row in request_fields.FIELDS
            for route in row.routes if row.status == status]


@pytest.mark.parametrize("route", list(ROUTE_PATHS))
def test_the_table_names_every_field_the_server_reads_and_reads_every_honoured_one(route):
    table = {row.name: row for row in request_fields.FIELDS if route in row.routes}
    honoured = {name for name, row in table.items() if row.status == request_fields.HONOURED}
    assert honoured <= known(route), honoured - known(route)  # honoured: read by the body model
    assert known(route) <= set(table), known(route) - set(table)  # read: in the table


def a_value(row):
    """A value that switches a refused field on."""
    if not row.off:
        return {"x": 1}
    off = row.off[0]
    return (not off if isinstance(off, bool) else off + 0.5 if isinstance(off, (int, float))
            else "x" if isinstance(off, str) else ["x"] if isinstance(off, list) else {"x": 1})


@pytest.mark.parametrize("route, row", rows(request_fields.REFUSED))
def test_a_refused_field_is_a_400_naming_it(served, route, row):
    reply = httpx.post(served.url + ROUTE_PATHS[route], json={**minimal(route), row.name: a_value(row)},
                       timeout=60)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == row.name and row.name in reply.json()["error"]["message"]


def text_of(route, reply) -> str:
    data = reply.json()
    return data["content"] if route == "native" else data["choices"][0]["text"] if route == "completions" \
        else data["choices"][0]["message"]["content"]


@pytest.mark.parametrize("route", list(ROUTE_PATHS))
def test_refused_fields_switched_off_and_fields_without_effect_change_nothing(served, route):
    """Every refused field at the value that switches it off, and every field without
    effect (a value of its type where the body reads it), all in one body: the reply
    is the one without them."""
    fields = {}
    for row in request_fields.FIELDS:
        if route in row.routes and row.status == request_fields.REFUSED and row.off:
            fields[row.name] = row.off[0]
        elif route in row.routes and row.status == request_fields.NO_EFFECT:
            field = MODELS[route].model_fields.get(row.name)  # (one the body reads is checked for its type)
            fields[row.name] = True if field is not None and field.annotation is bool else "some value"
    body = {**minimal(route), "max_tokens": 6, "temperature": 0}
    plain = httpx.post(served.url + ROUTE_PATHS[route], json=body, timeout=60)
    reply = httpx.post(served.url + ROUTE_PATHS[route], json={**body, **fields}, timeout=60)
    assert reply.status_code == plain.status_code == 200, reply.text
    assert text_of(route, reply) == text_of(route, plain)


def test_an_unknown_field_is_accepted_and_logged_once(served, caplog):
    body = {**minimal("chat"), "a_field_nobody_knows": 1}
    with caplog.at_level("WARNING", logger="edgespec.serve.server"):
        for _ in range(2):
            assert httpx.post(served.url + ROUTE_PATHS["chat"], json=body, timeout=60).status_code == 200
    lines = [r.getMessage() for r in caplog.records if "a_field_nobody_knows" in r.getMessage()]
    assert len(lines) == 1 and "does not know" in lines[0]


def test_docs_api_shows_the_table_the_server_reads():
    docs = (Path(__file__).parent.parent / "docs" / "api.md").read_text()
    assert request_fields.markdown() in docs


# -- llama-server's sampling fields, honoured on every route ----------------------------------


def native(served, **fields):
    reply = httpx.post(served.url + "/completion", json={"temperature": 0, "n_predict": 40, **fields},
                       timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


REPEATING = "List the numbers one, two, three, one, two, three, one, two, three, one,"


@pytest.mark.parametrize("route", ["chat", "native"])
def test_repeat_penalty_changes_the_reply_exactly_as_plain_decoding_does(served, route):
    def reply(**fields):
        if route == "chat":
            return chat(served, messages=[{"role": "user", "content": REPEATING}], max_tokens=24,
                        extra_body=fields).choices[0].message.content
        return native(served, prompt=REPEATING, n_predict=24, **fields)["content"]
    penalised = reply(repeat_penalty=1.8, repeat_last_n=64)
    assert penalised != reply()
    assert penalised == reply(repeat_penalty=1.8, repeat_last_n=64, speculative={"drafter": "off"})
    assert reply(repeat_penalty=1.8, repeat_last_n=0) == reply()  # a window of 0: off


def test_generation_settings_report_what_was_applied(served):
    settings = native(served, prompt="Hi", n_predict=2, repeat_penalty=1.3, repeat_last_n=32,
                      presence_penalty=0.5, frequency_penalty=0.25, typical_p=0.9, top_k=7, temperature=0.8,
                      samplers="ekypmt", **{"speculative.n_max": 3})["generation_settings"]
    assert settings["repeat_penalty"] == 1.3 and settings["repeat_last_n"] == 32
    assert settings["presence_penalty"] == 0.5 and settings["frequency_penalty"] == 0.25
    assert settings["typical_p"] == 0.9 and settings["top_k"] == 7
    assert settings["samplers"][-1] == "temperature"  # "ekypmt": temperature last, as sent
    assert settings["speculative.n_max"] == 3
    props = httpx.get(served.url + "/props", timeout=30).json()["default_generation_settings"]["params"]
    assert props["repeat_penalty"] == 1.0 and props["samplers"][1] == "temperature"


def test_samplers_leave_out_what_they_do_not_list_as_llama_server_does(served):
    seeded = dict(prompt="Once upon a time", temperature=1.0, seed=5, n_predict=16)
    top1 = native(served, **seeded, top_k=1)["content"]
    assert native(served, **seeded, top_k=1, samplers=["top_k", "temperature"])["content"] == top1
    unfiltered = native(served, **seeded)["content"]
    assert native(served, **seeded, top_k=1, samplers=["temperature"])["content"] == unfiltered != top1


def test_typical_p_changes_a_seeded_sample(served):
    seeded = dict(prompt="Once upon a time", temperature=1.0, seed=11, n_predict=16)
    assert native(served, **seeded, typical_p=0.2)["content"] != native(served, **seeded)["content"]


@pytest.mark.parametrize("route", ["chat", "native"])
def test_a_gbnf_grammar_and_a_json_schema_shape_the_reply(served, route):
    grammar = 'root ::= "{\\"answer\\": \\"" ("yes" | "no") "\\"}"'
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    for fields, check in ((dict(grammar=grammar), lambda t: json.loads(t)["answer"] in ("yes", "no")),
                          (dict(json_schema=schema), lambda t: isinstance(json.loads(t)["n"], int))):
        if route == "chat":
            text = chat(served, messages=[{"role": "user", "content": "Is water wet?"}], max_tokens=40,
                        extra_body=fields).choices[0].message.content
        else:
            text = native(served, prompt="Is water wet? Answer:", **fields)["content"]
        assert check(text), text
    with pytest.raises(openai.BadRequestError) as err:  # one grammar at a time
        chat(served, messages=ASK, response_format={"type": "json_object"}, extra_body={"grammar": grammar})
    assert err.value.body["param"] == "response_format"


def test_cache_prompt_false_evaluates_the_whole_prompt_again(served):
    prompt = "The cache keeps what was evaluated. " * 8
    native(served, prompt=prompt, n_predict=2)
    assert native(served, prompt=prompt, n_predict=2)["timings"]["cache_n"] > 0
    assert native(served, prompt=prompt, n_predict=2, cache_prompt=False)["timings"]["cache_n"] == 0


def test_n_probs_gives_completion_probabilities_whole_and_streamed(served):
    whole = native(served, prompt="Hello", n_predict=5, n_probs=3)
    probs = whole["completion_probabilities"]
    assert len(probs) == 5 and all(len(p["top_logprobs"]) == 3 for p in probs)
    assert "".join(p["token"] for p in probs) == whole["content"]
    assert all(p["top_logprobs"][0]["logprob"] >= p["logprob"] for p in probs)  # greedy: the top one
    with httpx.stream("POST", served.url + "/completion", timeout=120,
                      json={"prompt": "Hello", "n_predict": 5, "n_probs": 3, "temperature": 0,
                            "stream": True}) as reply:
        events = [json.loads(line[5:]) for line in reply.iter_lines() if line.startswith("data:")]
    streamed = [p for e in events if not e["stop"] for p in e["completion_probabilities"]]
    assert [p["id"] for p in streamed] == [p["id"] for p in probs]


def test_parallel_tool_calls_false_keeps_a_replys_first_call():
    from edgespec.serve.openai_fields import Extras
    from edgespec.serve.tool_calls import reply_calls
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    text = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>')
    assert len(reply_calls(text, Extras(tools=tools))[1]) == 2
    content, calls = reply_calls(text, Extras(tools=tools, parallel_tool_calls=False))
    assert content is None and [json.loads(c["function"]["arguments"])["city"] for c in calls] == ["Paris"]


@pytest.mark.parametrize("route", list(ROUTE_PATHS))
def test_the_servers_penalties_fill_what_a_request_leaves_unset(route):
    """`edgespec serve --repeat-penalty 1.2 --presence-penalty 0.5`: a request's defaults;
    a request that sets one keeps its own (0 included)."""
    from edgespec.core.sampling import SamplingParams
    served = {"repeat_penalty": 1.2, "presence_penalty": 0.5, "frequency_penalty": 0.0, "repeat_last_n": 32}
    body = MODELS[route].model_validate({**minimal(route), "presence_penalty": 0},
                                        context={"vocab_size": 100})
    shaping = body.request(SamplingParams(), served).extras.shaping
    assert (shaping.repeat_penalty, shaping.repeat_last_n, shaping.presence_penalty) == (1.2, 32, 0)
    plain = MODELS[route].model_validate(minimal(route), context={"vocab_size": 100}).request(SamplingParams())
    assert plain.extras.shaping is None
