"""The grammar a reply must follow, from the fields that ask for one: OpenAI's
``response_format``, llama-server's ``grammar`` (GBNF) and ``json_schema``, and the one
``tool_choice`` ``required`` or a named function implies (one of them per request).
Each is a validator of the request models in :mod:`~edgespec.serve.openai_api`."""

from __future__ import annotations

import json

from ..core.grammar import Grammar, closed
from .errors import invalid
from .tool_calls import CALL_CLOSE, CALL_OPEN


def gbnf(text) -> Grammar | None:
    """llama-server's ``grammar``: GBNF, converted to llguidance's Lark (empty: none)."""
    if text is None or text == "":
        return None
    if not isinstance(text, str):
        raise invalid("must be a GBNF grammar (a string)")
    try:
        return Grammar.gbnf(text)
    except ValueError as exc:
        raise invalid(f"is {exc}") from None


def json_schema(schema) -> Grammar | None:
    """llama-server's ``json_schema``: the schema the reply follows (``{}`` or null: none),
    its objects closed to properties they do not list unless they say otherwise, as
    llama.cpp's schema converter has it."""
    if schema is None or schema == {}:
        return None
    if not isinstance(schema, dict):
        raise invalid("must be a JSON schema (an object)")
    try:
        return Grammar.json_schema(closed(schema))
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
