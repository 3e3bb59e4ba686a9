"""The request fields that change what a reply must be, checked, and the reply
shapes they bring: ``response_format``, llama-server's ``grammar`` and
``json_schema``, ``tools``, ``tool_choice`` and ``parallel_tool_calls``,
``logprobs``, ``logit_bias``, the penalties, ``samplers`` and ``prediction``.

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
from .errors import ApiError, invalid

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
MAX_TOP_LOGPROBS = 20
WHOLE_CONTEXT = 1 << 30  # repeat_last_n -1: a window no context reaches past
FLOOR = -9999.0  # OpenAI's logprob for a token that cannot come (JSON has no -inf)


@dataclass
class Extras:
    """What the fields of one request ask for, checked."""

    shaping: Shaping | None = None
    logprobs: int | None = None          # top_logprobs (0..20) when logprobs are asked
    tools: list[dict] | None = None      # for the chat template
    tool_choice: str | dict = "auto"
    prediction: str | None = None
    parallel_tool_calls: bool = True     # False: at most one call


# -- the fields' validators (pydantic's, in openai_api's request models) ---------------------


def needs_logprobs(top, info):
    """Chat's ``top_logprobs`` is only read with ``logprobs: true``."""
    if top is not None and not info.data.get("logprobs"):
        raise invalid("needs logprobs: true")
    return top


def prediction(option) -> str | None:
    """``{"type": "content", "content": text or text parts}``: the text."""
    if option is None:
        return None
    if not isinstance(option, dict) or option.get("type") != "content":
        raise invalid('must be {"type": "content", "content": "..."}')
    content = text_of(option.get("content"))
    if content is None:
        raise invalid("prediction.content must be text (or text parts)", "prediction.content")
    return content


def text_of(content) -> str | None:
    """Text, or text parts (``[{"type": "text", "text": ...}]``) joined; None: neither."""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    return content if isinstance(content, str) else None


def logit_bias(bias) -> dict[int, float]:
    """Token ids (as JSON keys: text) to numbers from -100 to 100."""
    if bias is None:
        return {}
    if not isinstance(bias, dict):
        raise invalid("must map token ids to numbers from -100 to 100")
    out = {}
    for key, value in bias.items():
        try:
            out[int(key)] = value
        except (TypeError, ValueError):
            raise invalid(f"key {key!r} is not a token id") from None
    Shaping(logit_bias=out)  # its own checks (ValueError: named by pydantic)
    return out


def penalty(value, info):
    """``presence_penalty`` or ``frequency_penalty`` (-2..2), ``repeat_penalty`` (> 0)
    or ``repeat_last_n`` (>= 0; -1: the whole context, as llama-server reads it)."""
    name = info.field_name
    if value is None:
        return Shaping.__dataclass_fields__[name].default
    if name == "repeat_last_n" and value == -1 and not isinstance(value, bool):
        value = WHOLE_CONTEXT
    Shaping(**{name: value})  # its own checks (ValueError: named by pydantic)
    return value


def tools(tools) -> list[dict] | None:
    """Functions, for the chat template."""
    if tools is None:
        return None
    if not isinstance(tools, list) or not tools:
        raise invalid("must be a non-empty list of functions")
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict) \
                or not isinstance(function.get("name"), str) or not function["name"]:
            raise invalid(f'tools[{i}] must be {{"type": "function", "function": {{"name": ...}}}}',
                          f"tools[{i}]")
        if not isinstance(function.get("parameters", {}), dict):
            raise invalid(f"tools[{i}].function.parameters must be a JSON schema object",
                          f"tools[{i}].function.parameters")
    return tools


def tool_choice(choice, info) -> str | dict | None:
    """``auto``, ``none``, ``required`` or a named function of ``tools``."""
    tools = info.data.get("tools")
    if not tools:
        if choice not in (None, "none", "auto"):
            raise invalid("needs tools")
        return choice
    names = [t["function"]["name"] for t in tools]
    if isinstance(choice, dict):
        function = choice.get("function") if choice.get("type") == "function" else None
        if not isinstance(function, dict) or function.get("name") not in names:
            raise invalid(f"names a function that is not in tools ({', '.join(names)})")
    elif choice not in (None, "auto", "none", "required"):
        raise invalid("must be auto, none, required or a named function")
    return choice


def gbnf(text) -> Grammar | None:
    """llama-server's ``grammar``: GBNF, converted to llguidance's Lark (empty: none)."""
    if text is None or text == "":
        return None
    if not isinstance(text, str):
        raise invalid("must be a GBNF grammar (a string)")
    from llguidance.gbnf_to_lark import gbnf_to_lark
    try:
        return Grammar.lark(gbnf_to_lark(text))
    except Exception as exc:  # noqa: BLE001 - the converter's or llguidance's message, said plainly
        why = (str(exc).strip() or type(exc).__name__).splitlines()[0]
        raise invalid(f"is not a usable GBNF grammar ({why})") from None


def json_schema(schema) -> Grammar | None:
    """llama-server's ``json_schema``: the schema the reply follows (``{}`` or null: none)."""
    if schema is None or schema == {}:
        return None
    if not isinstance(schema, dict):
        raise invalid("must be a JSON schema (an object)")
    try:
        return Grammar.json_schema(schema)
    except ValueError as exc:
        raise invalid(str(exc)) from None


def response_format(option, info) -> Grammar | None:
    """The grammar a reply must follow: ``response_format``'s, ``grammar``'s,
    ``json_schema``'s, or the one ``tool_choice`` ``required`` or a named function asks
    for (one of them)."""
    asked = [(name, g) for name, g in (
        ("response_format", _format_grammar(option)), ("grammar", info.data.get("grammar")),
        ("json_schema", info.data.get("json_schema")),
        ("tool_choice", _tool_grammar(info.data.get("tools"), info.data.get("tool_choice"),
                                      info.data.get("parallel_tool_calls", True))))
        if g is not None]
    if len(asked) > 1:
        raise invalid(f"{asked[0][0]} cannot be combined with {asked[1][0]}: each constrains the "
                      f"whole reply, use one", asked[0][0])
    return asked[0][1] if asked else None


def _format_grammar(option) -> Grammar | None:
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
            raise invalid('response_format.json_schema must be {"name": ..., "schema": {...}}',
                          "response_format.json_schema")
        try:
            return Grammar.json_schema(spec.get("schema", {}), strict=bool(spec.get("strict")))
        except ValueError as exc:
            raise invalid(str(exc), "response_format.json_schema") from None
    raise invalid("response_format.type must be text, json_object or json_schema",
                  "response_format.type")


def _tool_grammar(tools: list[dict] | None, choice, parallel: bool = True) -> Grammar | None:
    """``required``: one or more calls of the listed functions (one with ``parallel``
    false); a named function: one call of it."""
    if not tools or choice in (None, "auto", "none"):
        return None
    named = choice["function"]["name"] if isinstance(choice, dict) else None
    options = [{"type": "object", "properties": {
        "name": {"const": t["function"]["name"]},
        "arguments": t["function"].get("parameters") or {"type": "object"}},
        "required": ["name", "arguments"]}
        for t in tools if named is None or t["function"]["name"] == named]
    call = f'"{CALL_OPEN}\\n" %json {json.dumps({"anyOf": options})} "\\n{CALL_CLOSE}"'
    repeat = "" if named or not parallel else ' ("\\n" call)*'
    try:
        return Grammar.lark(f"start: call{repeat}\ncall: {call}")
    except ValueError as exc:
        raise invalid(f"a tool's parameters are not a usable JSON schema ({exc})", "tools") from None


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


def reply_calls(text: str, extras: Extras) -> tuple[str | None, list[dict]]:
    """:func:`split_tool_calls` for a reply to ``extras``: its first call only with
    ``parallel_tool_calls: false``."""
    content, calls = split_tool_calls(text, tool_names(extras))
    return content, calls if extras.parallel_tool_calls else calls[:1]


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


def token_entries(entries: list[dict], token_bytes, *, ids: bool = False) -> list[dict]:
    """Each token of the engine's entries with its text, logprob and bytes, and its
    ``top_logprobs`` alike (``ids``: with the token ids too, as llama-server's
    ``completion_probabilities`` has them)."""
    def one(token: int, logprob: float) -> dict:
        piece = token_bytes(token)
        return {**({"id": token} if ids else {}), "token": piece.decode("utf-8", "replace"),
                "logprob": max(logprob, FLOOR), "bytes": list(piece)}
    return [{**one(e["id"], e["logprob"]),
             "top_logprobs": [one(t, lp) for t, lp in e["top"] if lp > float("-inf")]} for e in entries]


def chat_logprobs(entries: list[dict], token_bytes) -> dict:
    """``choices[].logprobs`` of a chat completion from the engine's entries."""
    return {"content": token_entries(entries, token_bytes)}


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


# -- samplers: llama-server's order of the sampling stages ---------------------------------

# llama.cpp's stage names, with its aliases (kebab-case, no dash, nucleus, temp, typ),
# and its one-letter codes (common/sampling.cpp).
_STAGES = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc",
           "temperature", "infill", "adaptive_p")
_ALIASES = {**{name: name for name in _STAGES}, **{n.replace("_", "-"): n for n in _STAGES},
            **{n.replace("_", ""): n for n in _STAGES}, "nucleus": "top_p", "temp": "temperature",
            "typ": "typ_p", "typical_p": "typ_p"}
_CODES = {"d": "dry", "k": "top_k", "y": "typ_p", "p": "top_p", "s": "top_n_sigma", "m": "min_p",
          "t": "temperature", "x": "xtc", "i": "infill", "e": "penalties", "a": "adaptive_p"}
FILTERS = ("top_k", "typ_p", "top_p", "min_p")  # edgespec's order of the filters


def samplers(value) -> tuple[str, ...] | None:
    """llama-server's ``samplers``: stage names (its aliases too) or a string of their
    letters (``"kypmt"``), as llama.cpp's canonical names."""
    if value is None:
        return None
    if isinstance(value, str):
        if bad := [c for c in value if c not in _CODES]:
            raise invalid(f"{bad[0]!r} is not a sampler letter (one of {''.join(_CODES)})")
        return tuple(_CODES[c] for c in value)
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        raise invalid("must be a list of sampler names or a string of sampler letters")
    if bad := [n for n in value if n.lower() not in _ALIASES]:
        raise invalid(f"{bad[0]!r} is not a sampler (one of {', '.join(_STAGES)})")
    return tuple(_ALIASES[n.lower()] for n in value)


def in_order(order: tuple[str, ...] | None, params, penalties: dict):
    """The sampling ``params`` and ``penalties`` (Shaping's fields) that ``order``
    (llama-server's ``samplers``) gives, exactly as llama-server reads it: a stage
    left out is not applied. An order edgespec cannot sample exactly is a 400: the
    filters must come as top_k, typ_p, top_p, min_p, the penalties before them and
    temperature, and temperature before or after all of typ_p, top_p and min_p
    that are on (llama.cpp's default order puts it after them)."""
    if order is None:
        return params, penalties
    if "infill" in order:
        raise ApiError(400, "the infill sampler is not supported: it changes the model's distribution "
                      "for fill-in-the-middle", param="samplers")
    off = {"top_k": {"top_k": 0}, "typ_p": {"typical_p": 1.0}, "top_p": {"top_p": 1.0},
           "min_p": {"min_p": 0.0}, "temperature": {"temperature": 1.0}}
    params = params.with_(**{k: v for stage, o in off.items() if stage not in order for k, v in o.items()})
    if "penalties" not in order:
        penalties = {**penalties, "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
    on = {"top_k": 0 < params.top_k, "typ_p": params.typical_p < 1.0, "top_p": params.top_p < 1.0,
          "min_p": params.min_p > 0.0, "temperature": not params.greedy and params.temperature != 1.0,
          "penalties": penalties.get("repeat_penalty", 1.0) != 1.0 or bool(
              penalties.get("presence_penalty")) or bool(penalties.get("frequency_penalty"))}
    at = {stage: order.index(stage) for stage in order if on.get(stage)}
    filters = [f for f in sorted(at, key=at.get) if f in FILTERS]
    if filters != [f for f in FILTERS if f in at]:
        raise ApiError(400, f"edgespec applies the filters in the order {', '.join(FILTERS)}; "
                      f"{' before '.join(filters)} is another distribution",
                       param="samplers")
    if "penalties" in at and any(at[s] < at["penalties"] for s in at if s != "penalties"):
        raise ApiError(400, "the penalties must come before the filters and temperature", param="samplers")
    scaled = [at[f] > at["temperature"] for f in ("typ_p", "top_p", "min_p") if f in at] \
        if "temperature" in at else []
    if scaled and any(scaled) != all(scaled):
        raise ApiError(400, "temperature must come before all of typ_p, top_p and min_p that are on, or "
                      "after all of them", param="samplers")
    return params.with_(temperature_last=bool(scaled) and not scaled[0]), penalties


def applied_samplers(params) -> list[str]:
    """The stages a generation with ``params`` applies, in order (llama-server's names)."""
    return ["penalties", *FILTERS, "temperature"] if params.temperature_last else \
        ["penalties", "temperature", *FILTERS]
