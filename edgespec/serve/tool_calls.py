"""Tool calls in a reply: found in its text as the model's chat template writes them
(Qwen2.5's ``<tool_call>{json}</tool_call>``, or one call as bare or fenced JSON), in
OpenAI's shape; held back while streamed text may still become one; and a conversation's
earlier calls given back to the template as it expects them."""

from __future__ import annotations

import json
import re
import uuid
from typing import Sequence

from .openai_fields import Extras

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
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
