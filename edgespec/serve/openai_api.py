"""The OpenAI wire format: requests checked into plain settings, results into responses.

No web framework here: :mod:`edgespec.serve.server` moves these dicts over HTTP.
Field names and shapes follow OpenAI's chat and completions APIs; responses
also carry llama-server's ``timings`` (``prompt_n``, ``predicted_per_second``,
``draft_n``, ``draft_n_accepted``, ...) so that clients which read
llama-server's numbers see edgespec's too.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from ..drafters.registry import REQUEST_CHOICES
from .openai_fields import Extras, FieldError, parse_extras, split_tool_calls, tool_names
from ..core.sampling import SamplingParams
from ..core.stats import GenerationStats

DRAFTERS = REQUEST_CHOICES  # a request's speculative.drafter
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
         "tool": "tool"}


class ApiError(Exception):
    """An error response: HTTP status and OpenAI's ``{"error": {...}}`` body."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code, self.headers = param, code, headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


@dataclass
class Request:
    """What one chat or completions request asks for, checked."""

    kind: str                      # "chat" or "completion"
    prompt: list[dict] | str | list[int]  # chat messages, or a completion prompt
    params: SamplingParams
    max_tokens: int | None         # None: until the context is full
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    model: str | None = None
    drafter: str | None = None     # a DRAFTERS name; None: the server's default
    num_draft: int | str | None = None  # k or "auto"; None: the server's default
    extras: Extras = field(default_factory=Extras)  # response_format, tools, logprobs, ...


def parse_request(body, kind: str, defaults: SamplingParams) -> Request:
    """Check a request body; raise :class:`ApiError` (400) naming the bad field."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    if kind == "chat":
        prompt = _messages(body.get("messages"))
    else:
        prompt = _prompt(body.get("prompt"))
    n = body.get("n", 1)
    if n not in (1, None):
        raise ApiError(400, "only n = 1 is supported", param="n")
    try:
        extras = parse_extras(body, kind)
    except FieldError as exc:
        raise ApiError(400, str(exc), param=exc.param) from None
    sampling = {name: body[key] for key, name in (("temperature", "temperature"), ("top_p", "top_p"),
                                                   ("top_k", "top_k"), ("min_p", "min_p"),
                                                   ("seed", "seed"))
                if body.get(key) is not None}
    try:
        params = defaults.with_(**sampling)
    except ValueError as exc:  # "invalid temperature='x': must be ..."
        raise ApiError(400, str(exc), param=param_of(exc)) from None
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)
                                   or max_tokens < 1):
        raise ApiError(400, f"invalid max_tokens={max_tokens!r}: must be an integer >= 1",
                       param="max_tokens")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "stream must be true or false", param="stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "stream_options must be an object", param="stream_options")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, "model must be a string", param="model")
    drafter, num_draft = _speculative(body.get("speculative"))
    return Request(kind, prompt, params, max_tokens, _stop(body.get("stop")), stream,
                   bool(options.get("include_usage")), model, drafter, num_draft, extras)


def param_of(exc: Exception) -> str | None:
    """The request field an edgespec error is about: "invalid temperature=..." names
    it; otherwise the messages or the prompt, where the error says so."""
    text = str(exc)
    if text.startswith("invalid ") and "=" in text:
        return text.removeprefix("invalid ").split("=")[0]
    return "messages" if "message" in text else "prompt" if "prompt" in text else None


def _messages(messages) -> list[dict]:
    """OpenAI chat messages as role/content strings (text parts joined)."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", param="messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ApiError(400, f"messages[{i}] must be an object", param=f"messages[{i}]")
        role = message.get("role")
        if role not in ROLES:
            raise ApiError(400, f"messages[{i}] has role {role!r}: use system, user, assistant or tool",
                           param=f"messages[{i}].role")
        content = message.get("content")
        calls = message.get("tool_calls") if role == "assistant" else None
        if calls is not None and not (isinstance(calls, list) and all(
                isinstance(c, dict) and isinstance(c.get("function"), dict)
                and isinstance(c["function"].get("name"), str) for c in calls)):
            raise ApiError(400, f"messages[{i}].tool_calls must be a list of function calls",
                           param=f"messages[{i}].tool_calls")
        if calls and content is None:
            content = ""
        if isinstance(content, list):  # content parts: text only
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise ApiError(400, f"messages[{i}].content: only text parts are supported",
                               param=f"messages[{i}].content")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise ApiError(400, f"messages[{i}] needs text content", param=f"messages[{i}].content")
        out.append({"role": ROLES[role], "content": content,
                    **({"tool_calls": calls} if calls else {}),
                    **({"tool_call_id": message["tool_call_id"]}
                       if role == "tool" and isinstance(message.get("tool_call_id"), str) else {})})
    return out


def _prompt(prompt) -> str | list[int]:
    """A completions prompt: text, token ids, or a list of one of either."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                   for t in prompt):
        return prompt
    raise ApiError(400, "prompt must be a non-empty string or list of token ids (one prompt only)",
                   param="prompt")


def _stop(stop) -> list[str]:
    if stop is None:
        return []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) for s in stop):
        raise ApiError(400, "stop must be a string or a list of up to 4 strings", param="stop")
    return stop


def _speculative(option) -> tuple[str | None, int | str | None]:
    """The extra ``speculative`` field: ``{"drafter": ..., "num_draft": ...}``."""
    if option is None:
        return None, None
    if not isinstance(option, dict):
        raise ApiError(400, 'speculative must be an object like {"drafter": "lookup", "num_draft": 4}',
                       param="speculative")
    drafter, k = option.get("drafter"), option.get("num_draft")
    if drafter is not None and drafter not in DRAFTERS:
        raise ApiError(400, f"speculative.drafter must be one of {', '.join(DRAFTERS)}",
                       param="speculative.drafter")
    if k is not None and k != "auto" and not (isinstance(k, int) and not isinstance(k, bool) and k >= 1):
        raise ApiError(400, "speculative.num_draft must be an integer >= 1 or \"auto\"",
                       param="speculative.num_draft")
    return drafter, k


# -- responses ------------------------------------------------------------------------------


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def finish(reason: str | None) -> str | None:
    """edgespec's finish reasons in OpenAI's words (a cancelled run only reaches a
    client that is gone, so "stop" will do)."""
    return None if reason is None else "length" if reason == "length" else "stop"


def usage(stats: GenerationStats, request: Request | None = None) -> dict:
    """OpenAI's usage; with a prediction, how many of its tokens the reply kept
    (accepted drafts from it) and how many it drafted that the reply did not."""
    out = {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.generated_tokens,
           "total_tokens": stats.prompt_tokens + stats.generated_tokens}
    if request is not None and request.extras.prediction is not None:
        accepted = stats.accepted_per_drafter.get("prediction", 0)
        out["completion_tokens_details"] = {
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": stats.drafted_per_drafter.get("prediction", 0) - accepted}
    return out


def timings(stats: GenerationStats) -> dict:
    """llama-server's ``timings`` (``cache_n``: prompt tokens reused from the KV cache),
    plus the drafter edgespec used."""
    predicted_ms = stats.decode_time_s * 1000
    prompt_ms = stats.prefill_time_s * 1000
    return {"cache_n": stats.cached_prompt_tokens,
            "prompt_n": stats.prompt_eval_tokens, "prompt_ms": prompt_ms,
            "prompt_per_second": stats.prefill_tokens_per_second,
            "predicted_n": stats.generated_tokens, "predicted_ms": predicted_ms,
            "predicted_per_second": stats.tokens_per_second,
            "draft_n": stats.drafted, "draft_n_accepted": stats.accepted,
            "drafter": stats.drafter, "draft_rounds": stats.rounds,
            "draft_rounds_per_drafter": dict(stats.rounds_per_drafter)}


def response(request: Request, id: str, model: str, text: str, reason: str,
             stats: GenerationStats, *, logprobs: dict | None = None) -> dict:
    """A whole (non-streamed) chat completion or text completion (``logprobs``: the
    choice's, shaped by :mod:`edgespec.serve.openai_fields`)."""
    if request.kind == "chat":
        message = {"role": "assistant", "content": text}
        calls = []
        if tool_names(request.extras):
            message["content"], calls = split_tool_calls(text, tool_names(request.extras))
            if calls:
                message["tool_calls"] = calls
        choice = {"index": 0, "message": message, "logprobs": logprobs,
                  "finish_reason": "tool_calls" if calls else finish(reason)}
    else:
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish(reason)}
    return {"id": id, "object": "chat.completion" if request.kind == "chat" else "text_completion",
            "created": int(time.time()), "model": model, "choices": [choice],
            "usage": usage(stats, request), "timings": timings(stats)}


def chunk(request: Request, id: str, model: str, text: str | None, *, from_draft: bool = False,
          reason: str | None = None, stats: GenerationStats | None = None,
          first: bool = False, logprobs: dict | None = None,
          tool_calls: list[dict] | None = None, draft_kind: str | None = None) -> dict:
    """One streamed chunk. ``from_draft`` (an extra field) marks an accepted draft
    token, and ``draft_kind`` ("copy" or "model") what kind of drafter drafted it;
    the last chunk has the finish reason and the timings. ``tool_calls``: the
    reply's calls, as one delta (each with its index)."""
    if request.kind == "chat":
        delta = {"role": "assistant", "content": text or ""} if first else \
            ({"content": text} if text else {})
        if tool_calls:
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(tool_calls)]
        choice = {"index": 0, "delta": delta, "logprobs": logprobs,
                  "finish_reason": "tool_calls" if tool_calls and reason else finish(reason)}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish(reason)}
    if text:
        choice["from_draft"] = from_draft
        if from_draft and draft_kind:
            choice["draft_kind"] = draft_kind
    data = {"id": id, "object": "chat.completion.chunk" if request.kind == "chat" else "text_completion",
            "created": int(time.time()), "model": model, "choices": [choice]}
    if stats is not None:
        data["timings"] = timings(stats)
    return data


def usage_chunk(request: Request, id: str, model: str, stats: GenerationStats) -> dict:
    """The extra last chunk ``stream_options.include_usage`` asks for (no choices)."""
    return {"id": id, "object": "chat.completion.chunk" if request.kind == "chat" else "text_completion",
            "created": int(time.time()), "model": model, "choices": [], "usage": usage(stats, request)}
