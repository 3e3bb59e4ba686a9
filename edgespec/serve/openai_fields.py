"""The OpenAI request fields that change what a reply must be, checked, and the
reply shapes they bring: ``response_format``, ``tools`` and ``tool_choice``,
``logprobs``, ``logit_bias``, the penalties and ``prediction``.

Each field is either honoured exactly or refused with a 400 naming it: nothing
that changes what the reply must be is ignored. Tools go through the model's own
chat template (Qwen2.5's writes each call as ``<tool_call>{json}</tool_call>``);
``tool_choice`` ``required`` or a named function is enforced with a grammar.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Sequence

from ..core.grammar import Grammar
from ..core.shaping import Shaping

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
MAX_TOP_LOGPROBS = 20
FLOOR = -9999.0  # OpenAI's logprob for a token that cannot come (JSON has no -inf)


class FieldError(ValueError):
    """A bad field: the message and the field's name (``ApiError``'s param)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass
class Extras:
    """What the fields of one request ask for, checked."""

    shaping: Shaping | None = None
    logprobs: int | None = None          # top_logprobs (0..20) when logprobs are asked
    tools: list[dict] | None = None      # for the chat template
    tool_choice: str | dict = "auto"
    prediction: str | None = None


def parse_extras(body: dict, kind: str) -> Extras:
    """Check the fields above in a request ``body`` ("chat" or "completion")."""
    extras = Extras(logprobs=_logprobs(body, kind), prediction=_prediction(body))
    extras.tools, extras.tool_choice = _tools(body)
    grammars = [g for g in (_response_format(body.get("response_format")),
                            _tool_grammar(extras.tools, extras.tool_choice)) if g is not None]
    if len(grammars) > 1:
        raise FieldError("response_format cannot be combined with tool_choice 'required' or a named "
                         "function: use one", "response_format")
    try:
        shaping = Shaping(_logit_bias(body.get("logit_bias")),
                          _number(body, "presence_penalty"), _number(body, "frequency_penalty"),
                          grammars[0] if grammars else None)
    except FieldError:
        raise
    except ValueError as exc:
        raise FieldError(str(exc), str(exc).removeprefix("invalid ").split("=")[0]) from None
    extras.shaping = shaping if shaping.active else None
    if extras.prediction is not None:  # OpenAI's own limits on Predicted Outputs
        for name, used in (("logprobs", extras.logprobs is not None), ("tools", bool(extras.tools)),
                           ("presence_penalty", bool(shaping.presence_penalty)),
                           ("frequency_penalty", bool(shaping.frequency_penalty)),
                           ("n", body.get("n", 1) not in (1, None))):
            if used:
                raise FieldError(f"{name} is not supported with predicted outputs", name)
    return extras


def _number(body: dict, name: str) -> float:
    value = body.get(name)
    return 0.0 if value is None else value


def _logit_bias(bias) -> dict[int, float]:
    if bias is None:
        return {}
    if not isinstance(bias, dict):
        raise FieldError("logit_bias must map token ids to numbers from -100 to 100", "logit_bias")
    out = {}
    for key, value in bias.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise FieldError(f"logit_bias key {key!r} is not a token id", "logit_bias") from None
        out[token] = value
    return out


def _logprobs(body: dict, kind: str) -> int | None:
    logprobs, top = body.get("logprobs"), body.get("top_logprobs")
    if kind == "completion":  # the legacy field: an integer, how many alternatives
        if logprobs is None:
            return None
        if not isinstance(logprobs, int) or isinstance(logprobs, bool) or not 0 <= logprobs <= 5:
            raise FieldError("logprobs must be an integer from 0 to 5", "logprobs")
        return logprobs
    if logprobs not in (None, True, False):
        raise FieldError("logprobs must be true or false", "logprobs")
    if top is not None:
        if not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= MAX_TOP_LOGPROBS:
            raise FieldError(f"top_logprobs must be an integer from 0 to {MAX_TOP_LOGPROBS}",
                             "top_logprobs")
        if not logprobs:
            raise FieldError("top_logprobs needs logprobs: true", "top_logprobs")
    return (top or 0) if logprobs else None


def _prediction(body: dict) -> str | None:
    prediction = body.get("prediction")
    if prediction is None:
        return None
    if not isinstance(prediction, dict) or prediction.get("type") != "content":
        raise FieldError('prediction must be {"type": "content", "content": "..."}', "prediction")
    content = prediction.get("content")
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise FieldError("prediction.content must be text (or text parts)", "prediction.content")
    return content


def _response_format(option) -> Grammar | None:
    if option is None:
        return None
    kind = option.get("type") if isinstance(option, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return Grammar.json_object()
    if kind == "json_schema":
        spec = option.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise FieldError('response_format.json_schema must be {"name": ..., "schema": {...}}',
                             "response_format.json_schema")
        try:
            return Grammar.json_schema(spec.get("schema", {}), strict=bool(spec.get("strict")))
        except ValueError as exc:
            raise FieldError(str(exc), "response_format.json_schema") from None
    raise FieldError("response_format.type must be text, json_object or json_schema",
                     "response_format.type")


# -- tools ------------------------------------------------------------------------------


def _tools(body: dict) -> tuple[list[dict] | None, str | dict]:
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is None:
        if choice not in (None, "none", "auto"):
            raise FieldError("tool_choice needs tools", "tool_choice")
        return None, "none"
    if not isinstance(tools, list) or not tools:
        raise FieldError("tools must be a non-empty list of functions", "tools")
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict) \
                or not isinstance(function.get("name"), str) or not function["name"]:
            raise FieldError(f'tools[{i}] must be {{"type": "function", "function": {{"name": ...}}}}',
                             f"tools[{i}]")
        if not isinstance(function.get("parameters", {}), dict):
            raise FieldError(f"tools[{i}].function.parameters must be a JSON schema object",
                             f"tools[{i}].function.parameters")
    names = [t["function"]["name"] for t in tools]
    choice = "auto" if choice is None else choice
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        if name not in names:
            raise FieldError(f"tool_choice names a function that is not in tools ({', '.join(names)})",
                             "tool_choice")
    elif choice not in ("auto", "none", "required"):
        raise FieldError("tool_choice must be auto, none, required or a named function", "tool_choice")
    return tools, choice


def _tool_grammar(tools: list[dict] | None, choice) -> Grammar | None:
    """``required``: one or more calls of the listed functions; a named function: one call of it."""
    if not tools or choice in ("auto", "none"):
        return None
    named = choice["function"]["name"] if isinstance(choice, dict) else None
    options = [{"type": "object", "properties": {
        "name": {"const": t["function"]["name"]},
        "arguments": t["function"].get("parameters") or {"type": "object"}},
        "required": ["name", "arguments"]}
        for t in tools if named is None or t["function"]["name"] == named]
    call = f'"{CALL_OPEN}\\n" %json {json.dumps({"anyOf": options})} "\\n{CALL_CLOSE}"'
    repeat = "" if named else ' ("\\n" call)*'
    try:
        return Grammar.lark(f"start: call{repeat}\ncall: {call}")
    except ValueError as exc:
        raise FieldError(f"a tool's parameters are not a usable JSON schema ({exc})", "tools") from None


_CALL = re.compile(re.escape(CALL_OPEN) + r"\s*(.*?)\s*" + re.escape(CALL_CLOSE), re.S)
# A reply that is one call written as JSON, bare or fenced (what Qwen2.5-Coder writes
# more often than its template's tags; llama.cpp's Hermes parser accepts it too).
_BARE = re.compile(r"\A\s*(?:```(?:json)?\s*)?(\{.*\})\s*(?:```)?\s*\Z", re.S)
STARTS = (CALL_OPEN, "```json", "{")  # how a reply that is a call begins


def split_tool_calls(text: str, names: Sequence[str]) -> tuple[str | None, list[dict]]:
    """The reply's text before its first call, and its calls of the functions
    ``names`` in OpenAI's shape (``{"id", "type": "function", "function": {"name",
    "arguments": json text}}``); a call whose JSON does not parse stays in the text."""
    matches = [(m.start(), m.group(1)) for m in _CALL.finditer(text)]
    if not matches and (bare := _BARE.match(text)):
        matches = [(0, bare.group(1))]
    calls, first = [], None
    for start, body in matches:
        try:
            call = json.loads(body)
        except ValueError:
            try:  # {{...}}: a template that shows its example call with Jinja's braces doubled
                call = json.loads(body[1:-1]) if body.startswith("{{") and body.endswith("}}") else None
            except ValueError:
                continue
        if not isinstance(call, dict) or call.get("name") not in names:
            continue
        first = start if first is None else first
        arguments = call.get("arguments", call.get("parameters", {}))
        calls.append({"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                      "function": {"name": call["name"],
                                   "arguments": arguments if isinstance(arguments, str)
                                   else json.dumps(arguments, ensure_ascii=False)}})
    if not calls:
        return text, []
    content = text[:first].strip()
    return content or None, calls


def tool_names(extras: Extras) -> list[str]:
    """The functions a reply may call (none with ``tool_choice: none``)."""
    if not extras.tools or extras.tool_choice == "none":
        return []
    return [t["function"]["name"] for t in extras.tools]


def may_be_call(text: str) -> bool:
    """Whether streamed text could still be the start of a tool call (held back)."""
    stripped = text.lstrip()
    return any(start.startswith(stripped) or stripped.startswith(start) for start in STARTS)


def template_messages(messages: list[dict]) -> list[dict]:
    """Assistant tool calls with their arguments as objects, as templates expect them."""
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if calls:
            message = {**message, "content": message.get("content") or "", "tool_calls": [
                {**c, "function": {**c["function"], "arguments": _json_or_text(c["function"].get("arguments"))}}
                for c in calls]}
        out.append(message)
    return out


def _json_or_text(arguments):
    try:
        return json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        return arguments


# -- logprobs ---------------------------------------------------------------------------


def chat_logprobs(entries: list[dict], token_bytes) -> dict:
    """``choices[].logprobs`` of a chat completion from the engine's entries."""
    def one(token: int, logprob: float) -> dict:
        piece = token_bytes(token)
        return {"token": piece.decode("utf-8", "replace"), "logprob": max(logprob, FLOOR),
                "bytes": list(piece)}
    return {"content": [{**one(e["id"], e["logprob"]),
                         "top_logprobs": [one(t, lp) for t, lp in e["top"] if lp > float("-inf")]}
                        for e in entries]}


def completion_logprobs(entries: list[dict], token_bytes, offset: int = 0) -> dict:
    """``choices[].logprobs`` of a (legacy) text completion."""
    tokens = [token_bytes(e["id"]).decode("utf-8", "replace") for e in entries]
    offsets, at = [], offset
    for text in tokens:
        offsets.append(at)
        at += len(text)
    return {"tokens": tokens, "token_logprobs": [max(e["logprob"], FLOOR) for e in entries],
            "top_logprobs": [{token_bytes(t).decode("utf-8", "replace"): lp for t, lp in e["top"]
                              if lp > float("-inf")} for e in entries],
            "text_offset": offsets}
