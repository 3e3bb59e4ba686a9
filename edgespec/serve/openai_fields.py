"""The request fields that change what a reply must be, checked: ``tools``,
``tool_choice`` and ``parallel_tool_calls``, ``logprobs``, ``logit_bias``, the
penalties and ``prediction`` (:class:`Extras`: what one request asks for). Each
field is either honoured exactly or refused with a 400 naming it: nothing that
changes what the reply must be is ignored.

Their neighbours, one job each: the grammar a reply follows (:mod:`.grammars`:
``response_format``, ``grammar``, ``json_schema``, a required tool call), the tool
calls found in a reply (:mod:`.tool_calls`), log probabilities in the replies'
shapes (:mod:`.logprobs`) and llama-server's order of the sampling stages
(:mod:`.sampler_order`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.shaping import Shaping
from .errors import invalid

MAX_TOP_LOGPROBS = 20
WHOLE_CONTEXT = 1 << 30  # repeat_last_n -1: a window no context reaches past


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
