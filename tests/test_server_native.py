"""llama-server's native endpoints in ``edgespec serve`` (``/completion``, ``/props``,
``/tokenize``, ``/detokenize``, ``/metrics``), and its conventions on the OpenAI ones
(``timings.cache_n``, any model name, a log line per request), on a real server
with SmolLM2 behind it, read the way the clients that use them read them."""

from __future__ import annotations

import json
import logging

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from test_server import HELLO, RunningServer, engine, served  # noqa: F401 (the fixtures)

# A prompt the model continues by copying: prompt lookup drafts, and some drafts pass.
COPY = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10\n1, 2, 3, 4, 5, 6, 7, 8, 9, 10\n1, 2, 3,"
TIMEOUT = 300  # (a busy 2-core machine)


def post(served, path: str, body, **options) -> httpx.Response:
    return httpx.post(served.url + path, json=body, timeout=TIMEOUT, **options)


def continue_stream(served, body: dict) -> tuple[str, list[dict], list[str]]:
    """POST /completion as Continue's llama.cpp provider does (core/llm/llms/LlamaCpp.ts:
    ``streamSse`` over the response, yielding ``value.content`` where it is truthy): the
    text it shows, every event, and every line."""
    text, events, lines = "", [], []
    headers = {"Authorization": "Bearer undefined"}  # (what it sends with no key set)
    with httpx.stream("POST", served.url + "/completion", json=body, headers=headers,
                      timeout=TIMEOUT) as reply:
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
        for line in reply.iter_lines():
            lines.append(line)
            if not line.startswith("data:"):
                continue
            value = json.loads(line.removeprefix("data:").strip())
            assert not value.get("error"), value
            events.append(value)
            if value["content"]:
                text += value["content"]
    return text, events, lines


def test_a_completion_streamed_as_continue_reads_it_matches_the_whole_one(served):
    body = {"model": "whatever-continue-calls-it", "prompt": COPY, "stream": True, "n_predict": 24,
            "stop": ["\n\n"], "top_k": 40, "top_p": 0.95, "min_p": 0.05, "temperature": 0}
    text, events, lines = continue_stream(served, body)
    whole = post(served, "/completion", {**body, "stream": False}).json()
    openai = post(served, "/v1/completions", {"prompt": COPY, "max_tokens": 24, "stop": ["\n\n"],
                                             "top_k": 40, "top_p": 0.95, "min_p": 0.05,
                                             "temperature": 0}).json()
    assert text and text == whole["content"] == openai["choices"][0]["text"]
    *partials, last = events
    assert all(e["stop"] is False and "timings" not in e for e in partials)
    assert last["stop"] is True and last["content"] == "" and "[DONE]" not in "".join(lines)
    assert last["has_new_line"] == whole["has_new_line"] == ("\n" in text)
    assert last["tokens_predicted"] == whole["tokens_predicted"] == last["timings"]["predicted_n"]
    assert last["stop_type"] == whole["stop_type"] in ("eos", "word", "limit")
    assert (whole["stop_type"] == "limit") == (whole["tokens_predicted"] == 24)
    assert whole["model"] == served.settings.model_names[0] and whole["truncated"] is False
    assert whole["tokens_evaluated"] == last["timings"]["prompt_n"] + last["timings"]["cache_n"]
    assert whole["generation_settings"]["n_predict"] == 24 and whole["tokens"] == []
    assert any(e.get("from_draft") for e in partials)  # drafts were accepted, and marked


def test_return_tokens_and_a_stop_word(served):
    reply = post(served, "/completion", {"prompt": COPY, "n_predict": 24, "temperature": 0,
                                         "return_tokens": True}).json()
    assert len(reply["tokens"]) == reply["tokens_predicted"]
    assert post(served, "/detokenize", {"tokens": reply["tokens"]}).json()["content"] == reply["content"]
    word = reply["content"].split(",")[2]  # a piece of what it says: it stops there
    cut = post(served, "/completion", {"prompt": COPY, "n_predict": 24, "temperature": 0,
                                       "stop": [word]}).json()
    assert cut["stop_type"] == "word" and cut["stopping_word"] == word
    assert cut["content"] == reply["content"][:reply["content"].index(word)]


def test_props_read_as_zed_reads_it_and_its_defaults_are_a_valid_request(served, engine):
    # Zed (crates/llama_cpp): GET /props?model=ID, then default_generation_settings.n_ctx
    # (> 0), modalities.vision, chat_template_caps; GET /v1/models, data[].meta.n_ctx.
    props = httpx.get(served.url + "/props", params={"model": "any/model:Q4"}, timeout=TIMEOUT).json()
    assert props["default_generation_settings"]["n_ctx"] == engine.n_ctx > 0
    assert props["modalities"]["vision"] is False and "chat_template_caps" not in props
    models = httpx.get(served.url + "/v1/models", timeout=TIMEOUT).json()
    assert models["data"][0]["meta"]["n_ctx"] == engine.n_ctx
    assert props["total_slots"] == 1 and props["model_path"].endswith(".gguf")
    assert "<|im_start|>" in props["chat_template"] and props["build_info"].startswith("edgespec")
    # edgespec's speculative: the drafters a request may name, and the server's defaults.
    spec = props["speculative"]
    assert {"lookup", "suffix", "off"} <= set(spec["drafters"]) and "model" not in spec["drafters"]
    assert spec["drafter"] == "lookup" and spec["num_draft"] == 4 and spec["draft_model"] is None
    assert spec["num_draft_auto"] is True
    params = props["default_generation_settings"]["params"]
    assert params["temperature"] == 0 and params["n_predict"] == -1 and params["seed"] == -1
    # A page that reads the defaults and sends them back with a prompt gets a completion.
    reply = post(served, "/completion", {**params, "prompt": "Hello", "n_predict": 3})
    assert reply.status_code == 200, reply.text
    assert reply.json()["tokens_predicted"] <= 3


def _families(served) -> dict:
    reply = httpx.get(served.url + "/metrics", timeout=TIMEOUT)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
    return {f.name: f for f in text_string_to_metric_families(reply.text)}


def _value(families: dict, name: str, **labels) -> float:
    return sum(s.value for s in families[name].samples
               if not s.name.endswith("_created") and all(s.labels.get(k) == v for k, v in labels.items()))


def test_metrics_add_up_to_the_timings_of_the_requests_made(served):
    before = _families(served)
    timings = [post(served, "/completion", {"prompt": COPY, "n_predict": 20, "temperature": 0})
               .json()["timings"],
               continue_stream(served, {"prompt": COPY + " 4,", "stream": True, "n_predict": 12,
                                        "temperature": 0})[1][-1]["timings"],
               post(served, "/v1/chat/completions", {"messages": HELLO, "max_tokens": 12,
                                                     "temperature": 0}).json()["timings"]]
    after = _families(served)

    def delta(name: str, **labels) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    for metric, field in (("llamacpp:tokens_predicted", "predicted_n"), ("llamacpp:prompt_tokens", "prompt_n"),
                          ("edgespec:prompt_tokens_cached", "cache_n"), ("edgespec:drafted_tokens", "draft_n"),
                          ("edgespec:accepted_tokens", "draft_n_accepted")):
        assert delta(metric) == sum(t[field] for t in timings), metric
    assert delta("edgespec:drafted_tokens") > 0
    assert delta("llamacpp:prompt_seconds") == pytest.approx(sum(t["prompt_ms"] for t in timings) / 1000)
    # Every round was the lookup drafter's: its labelled totals are the totals.
    assert delta("edgespec:drafter_drafted_tokens", drafter="lookup") == delta("edgespec:drafted_tokens")
    assert delta("edgespec:drafter_accepted_tokens", drafter="lookup") == delta("edgespec:accepted_tokens")
    assert delta("edgespec:drafter_rounds", drafter="lookup") > 0
    assert delta("edgespec:generations") == 3
    assert _value(after, "llamacpp:requests_processing") == _value(after, "llamacpp:requests_deferred") == 0
    assert _value(after, "llamacpp:predicted_tokens_seconds") > 0


def test_tokenize_and_detokenize_round_trip(served, engine):
    text = "Hello, world! café 🙂 <|im_start|>"
    tokens = post(served, "/tokenize", {"content": text}).json()["tokens"]
    assert tokens == engine.target.tokenize(text, add_bos=False, special=True)
    assert post(served, "/detokenize", {"tokens": tokens}).json() == {"content": text}
    plain = post(served, "/tokenize", {"content": text, "parse_special": False}).json()["tokens"]
    assert len(plain) > len(tokens)  # the special token's text, spelled in pieces
    assert post(served, "/tokenize", {"content": text, "add_special": True}).json()["tokens"] == \
        engine.target.tokenize(text, add_bos=True, special=True)
    pieces = post(served, "/tokenize", {"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == tokens
    spelled = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"])
                       for p in pieces)
    assert spelled.decode() == text


def test_cache_n_counts_the_prompt_a_second_request_shares(served, engine):
    first = post(served, "/completion", {"prompt": "A list of fruits:\n", "n_predict": 4,
                                         "temperature": 0}).json()
    shared = engine.tokenize("A list of fruits:\n")
    second = post(served, "/completion", {"prompt": "A list of fruits:\napple, pear, plum,",
                                          "n_predict": 4, "temperature": 0}).json()
    assert first["tokens_evaluated"] == len(shared)
    assert second["timings"]["cache_n"] >= len(shared) - 1 > 0
    assert second["timings"]["cache_n"] + second["timings"]["prompt_n"] == second["tokens_evaluated"]
    # The OpenAI endpoints carry it too: a second turn reuses the first's tokens.
    messages = [{"role": "user", "content": "Name a colour."}]
    reply = served.client().chat.completions.create(model="x", messages=messages, max_tokens=6,
                                                    temperature=0)
    messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                 {"role": "user", "content": "Another one."}]
    again = served.client().chat.completions.create(model="x", messages=messages, max_tokens=4,
                                                    temperature=0)
    assert again.model_extra["timings"]["cache_n"] > reply.usage.prompt_tokens // 2


def test_any_model_name_is_served_by_the_one_model(served):
    name = served.settings.model_names[0]
    chat = served.client().chat.completions.create(model="gpt-4o", messages=HELLO, max_tokens=3)
    text = served.client().completions.create(model="llama", prompt="Hello", max_tokens=3)
    native = post(served, "/completion", {"model": "qwen", "prompt": "Hello", "n_predict": 3}).json()
    assert chat.model == text.model == native["model"] == name


def test_a_log_line_per_request(served, caplog):
    caplog.set_level(logging.INFO, logger="edgespec.serve.server")
    reply = post(served, "/completion", {"prompt": COPY, "n_predict": 8, "temperature": 0}).json()
    t = reply["timings"]
    lines = [r.getMessage() for r in caplog.records if r.name == "edgespec.serve.server"]
    assert any(line.startswith(f"completion: prompt {reply['tokens_evaluated']} tokens "
                               f"({t['cache_n']} cached: {t['cache_n'] - t['cache_restored_n']} in the "
                               f"KV cache, {t['cache_restored_n']} restored from RAM; {t['prompt_n']} evaluated")
               and f"decode {t['predicted_n']} tokens" in line
               and f"drafted {t['draft_n']}, accepted {t['draft_n_accepted']}" in line
               and "drafter lookup, finish length" in line for line in lines), lines


def test_the_api_key_covers_the_native_endpoints_as_in_llama_server(engine):
    running = RunningServer(engine, api_key="s3cret")
    calls = [("GET", "/props", None), ("GET", "/metrics", None),
             ("POST", "/completion", {"prompt": "Hi", "n_predict": 1}),
             ("POST", "/completions", {"prompt": "Hi", "n_predict": 1}),
             ("POST", "/tokenize", {"content": "Hi"}), ("POST", "/detokenize", {"tokens": [1]})]
    try:
        for method, path, body in calls:
            refused = httpx.request(method, running.url + path, json=body, timeout=TIMEOUT)
            assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
            for header in ({"Authorization": "Bearer s3cret"}, {"X-Api-Key": "s3cret"}):
                reply = httpx.request(method, running.url + path, json=body, headers=header,
                                      timeout=TIMEOUT)
                assert reply.status_code == 200, (path, reply.text)
        for path in ("/health", "/v1/health"):  # llama-server's open paths
            assert httpx.get(running.url + path, timeout=TIMEOUT).json()["status"] == "ok"
    finally:
        running.stop()


@pytest.mark.parametrize("path, body, param", [
    ("/completion", {"prompt": ""}, "prompt"),
    ("/completion", {"n_predict": 4}, "prompt"),
    ("/completion", {"prompt": [1, "a"]}, "prompt"),
    ("/completion", {"prompt": "word " * 1500}, "prompt"),  # more than the context
    ("/completion", {"prompt": [10 ** 9]}, "prompt"),
    ("/completion", {"prompt": "x", "n_predict": 0}, "n_predict"),
    ("/completion", {"prompt": "x", "n_predict": "5"}, "n_predict"),
    ("/completion", {"prompt": "x", "temperature": "hot"}, "temperature"),
    ("/completion", {"prompt": "x", "top_k": -1}, "top_k"),
    ("/completion", {"prompt": "x", "seed": -2}, "seed"),
    ("/completion", {"prompt": "x", "stop": [1]}, "stop"),
    ("/completion", {"prompt": "x", "stream": "yes"}, "stream"),
    ("/completion", {"prompt": "x", "cache_prompt": "yes"}, "cache_prompt"),
    ("/completion", {"prompt": "x", "mirostat": 2}, "mirostat"),
    ("/completion", {"prompt": "x", "repeat_penalty": 0}, "repeat_penalty"),
    ("/completion", {"prompt": "x", "repeat_last_n": -2}, "repeat_last_n"),
    ("/completion", {"prompt": "x", "grammar": "root ::= ("}, "grammar"),
    ("/completion", {"prompt": "x", "xtc_probability": 0.5}, "xtc_probability"),
    ("/completion", {"prompt": "x", "samplers": ["top_p", "top_k"], "top_p": 0.9, "top_k": 5},
     "samplers"),
    ("/completion", {"prompt": "x", "speculative": {"drafter": "model"}}, "speculative.drafter"),
    ("/completions", {"prompt": "x", "n_probs": 21}, "n_probs"),
    ("/tokenize", {}, "content"),
    ("/tokenize", {"content": 5}, "content"),
    ("/tokenize", {"content": "x" * 10 ** 6}, "content"),  # more than any context holds
    ("/tokenize", {"content": "x", "with_pieces": 1}, "with_pieces"),
    ("/detokenize", {}, "tokens"),
    ("/detokenize", {"tokens": "abc"}, "tokens"),
    ("/detokenize", {"tokens": [-1]}, "tokens"),
    ("/detokenize", {"tokens": [10 ** 9]}, "tokens"),
    ("/detokenize", {"tokens": [True]}, "tokens"),
])
def test_bad_input_to_the_native_endpoints_is_a_400_naming_the_field(served, path, body, param):
    reply = post(served, path, body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param and "Traceback" not in reply.text


@pytest.mark.parametrize("path", ["/completion", "/tokenize", "/detokenize"])
def test_a_body_that_is_not_a_json_object_is_a_400(served, path):
    for content in (b"{nope", b"[1, 2]", b"null"):
        reply = httpx.post(served.url + path, content=content, timeout=TIMEOUT,
                           headers={"Content-Type": "application/json"})
        assert reply.status_code == 400 and reply.json()["error"]["message"], (content, reply.text)
