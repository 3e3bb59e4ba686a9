"""The OpenAI wire format: request bodies (pydantic models) checked into plain
settings, results into responses.

No web framework here: :mod:`edgespec.serve.server` moves these over HTTP.
Field names and shapes follow OpenAI's chat and completions APIs; responses
also carry llama-server's ``timings`` (``prompt_n``, ``predicted_per_second``,
``draft_n``, ``draft_n_accepted``, ...) so that clients which read
llama-server's numbers see edgespec's too. What each field does, and what happens to
one outside the table (accepted, its name logged once), is
:mod:`edgespec.serve.request_fields`'s, checked before a body gets here.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, AliasChoices, BaseModel, BeforeValidator, ConfigDict, Field,
                      PlainValidator, StrictBool, StrictInt, StrictStr, model_validator)

from ..drafters.prediction import PredictedOutput
from ..drafters.registry import REQUEST_CHOICES
from . import grammars, openai_fields as fields, sampler_order
from .errors import invalid
from .openai_fields import MAX_TOP_LOGPROBS, Extras
from .tool_calls import reply_calls, tool_names
from ..core.generation import PromptProgress
from ..core.grammar import Grammar
from ..core.sampling import SamplingParams
from ..core.shaping import REPEAT_LAST_N, Shaping
from ..core.stats import GenerationStats

DRAFTERS = REQUEST_CHOICES  # a request's speculative.drafter
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
         "tool": "tool"}
PENALTIES = ("presence_penalty", "frequency_penalty", "repeat_penalty", "repeat_last_n")
SAMPLING = ("temperature", "top_p", "top_k", "min_p", "typical_p", "seed")


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
    cache_prompt: bool = True      # False: nothing cached is reused for the prompt
    return_progress: bool = False  # streamed: prompt_progress events while the prompt is processed


def _sampling(value, info):
    """A sampling field, checked as :class:`SamplingParams` checks it (its message names it)."""
    if value is not None:
        SamplingParams(**{info.field_name: value})
    return value


def _prompt(prompt) -> str | list[int]:
    """A completions prompt: text, token ids, or a list of one of either."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                   for t in prompt):
        return prompt
    raise invalid("must be a non-empty string or list of token ids (one prompt only)")


def _stop(stop) -> list[str]:
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) for s in stop):
        raise invalid("must be a string or a list of up to 4 strings")
    return stop


def _num_draft(k):
    if k is not None and k != "auto" and not (isinstance(k, int) and not isinstance(k, bool) and k >= 1):
        raise invalid('must be an integer >= 1 or "auto"')
    return k


def _n_max(k):
    """llama-server's ``speculative.n_max``: the most tokens a draft has (edgespec's k)."""
    if k is not None and not (isinstance(k, int) and not isinstance(k, bool) and k >= 1):
        raise invalid("must be an integer >= 1", "speculative.n_max")
    return k


def _tool_calls(calls, info):
    if info.data.get("role") != "assistant":
        return None  # (read on an assistant's message only)
    if calls is not None and not (isinstance(calls, list) and all(
            isinstance(c, dict) and isinstance(c.get("function"), dict)
            and isinstance(c["function"].get("name"), str) for c in calls)):
        raise invalid("must be a list of function calls")
    return calls


def _content(content, info) -> str:
    text = "" if content is None and info.data.get("tool_calls") else fields.text_of(content)
    if text is None:
        raise invalid("only text parts are supported" if isinstance(content, list) else "needs text content")
    return text


Sampling = Annotated[Any, AfterValidator(_sampling)]


class Message(BaseModel):
    """An OpenAI chat message: its role and text (text parts joined), an assistant's
    tool calls, a tool's reply's ``tool_call_id``."""

    role: Literal[tuple(ROLES)]
    tool_calls: Annotated[list[dict] | None, PlainValidator(_tool_calls)] = None
    content: Annotated[str, PlainValidator(_content)] = Field(None, validate_default=True)
    tool_call_id: Any = None

    def plain(self) -> dict:
        """The message as the chat template takes it."""
        return {"role": ROLES[self.role], "content": self.content,
                **({"tool_calls": self.tool_calls} if self.tool_calls else {}),
                **({"tool_call_id": self.tool_call_id}
                   if self.role == "tool" and isinstance(self.tool_call_id, str) else {})}


class Speculative(BaseModel):
    """The extra ``speculative`` field: ``{"drafter": "lookup", "num_draft": 4}``."""

    drafter: Literal[DRAFTERS] | None = None
    num_draft: Annotated[int | str | None, PlainValidator(_num_draft)] = None


# Pydantic checks a model's fields in order, a base's before its subclass's, and the
# error named is the first: the bases below are ordered so that a request's messages or
# prompt come first, then the fields all requests share, as edgespec has always checked them.

class _Messages(BaseModel):
    messages: Annotated[list[Message], Field(min_length=1)]


class _Prompt(BaseModel):
    prompt: Annotated[str | list[int], PlainValidator(_prompt)]


class _Shared(BaseModel):
    """The fields chat and completions requests share."""

    model_config = ConfigDict(loc_by_alias=False, arbitrary_types_allowed=True)

    n: Literal[1] | None = 1
    logprobs: Literal[True, False] | None = None  # (1 and 0 too)
    top_logprobs: Annotated[Annotated[StrictInt, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None,
                            AfterValidator(fields.needs_logprobs)] = None
    prediction: Annotated[str | None, PlainValidator(fields.prediction)] = None
    tools: Annotated[list[dict] | None, PlainValidator(fields.tools)] = None
    tool_choice: Annotated[str | dict | None, PlainValidator(fields.tool_choice)] = None
    parallel_tool_calls: StrictBool = True
    grammar: Annotated[Grammar | None, PlainValidator(grammars.gbnf)] = None
    json_schema: Annotated[Grammar | None, PlainValidator(grammars.json_schema)] = None
    response_format: Annotated[Grammar | None, PlainValidator(grammars.response_format)] = \
        Field(None, validate_default=True)  # (grammar's, json_schema's, tool_choice's, too)
    logit_bias: Annotated[dict[int, float], PlainValidator(fields.logit_bias)] = {}
    presence_penalty: Annotated[float, PlainValidator(fields.penalty)] = 0.0
    frequency_penalty: Annotated[float, PlainValidator(fields.penalty)] = 0.0
    repeat_penalty: Annotated[float, PlainValidator(fields.penalty)] = 1.0
    repeat_last_n: Annotated[int, PlainValidator(fields.penalty)] = REPEAT_LAST_N
    temperature: Sampling = None  # (in the order SamplingParams checks them)
    top_k: Sampling = None
    top_p: Sampling = None
    min_p: Sampling = None
    typical_p: Sampling = None
    seed: Sampling = None
    samplers: Annotated[tuple[str, ...] | None, PlainValidator(sampler_order.samplers)] = None
    cache_prompt: StrictBool = True
    return_progress: StrictBool = False
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = Field(
        None, validation_alias=AliasChoices("max_completion_tokens", "max_tokens"))
    stream: StrictBool = False
    stream_options: Annotated[dict, BeforeValidator(lambda options: options or {})] = {}
    model: StrictStr | None = None
    speculative: Speculative | None = None
    n_max: Annotated[int | None, PlainValidator(_n_max)] = Field(None, alias="speculative.n_max")
    stop: Annotated[list[str], PlainValidator(_stop)] = []

    @model_validator(mode="after")
    def _prediction_alone(self):
        """OpenAI's own limits on Predicted Outputs."""
        if self.prediction is not None:
            for name, used in (("logprobs", self.asked_logprobs() is not None), ("tools", bool(self.tools)),
                               ("presence_penalty", bool(self.presence_penalty)),
                               ("frequency_penalty", bool(self.frequency_penalty))):
                if used:
                    raise invalid(f"{name} is not supported with predicted outputs", name)
        return self

    @model_validator(mode="after")
    def _in_vocabulary(self, info):
        """The logit bias's token ids are the model's (checked last, as the engine did)."""
        vocab = info.context["vocab_size"]
        if bad := [t for t in self.logit_bias if t >= vocab]:
            raise invalid(f"invalid logit_bias={bad[0]!r}: the model's token ids are 0..{vocab - 1}",
                          "logit_bias")
        return self

    def asked_logprobs(self) -> int | None:
        """How many alternatives each token's logprobs list; None: no logprobs."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def request(self, defaults: SamplingParams, penalties: dict | None = None) -> Request:
        """What this body asks for, sampling left unset taken from ``defaults`` and
        penalties left unset from ``penalties`` (the server's, by field name)."""
        sampling = {name: getattr(self, name) for name in SAMPLING if getattr(self, name) is not None}
        penalties = {name: getattr(self, name) if name in self.model_fields_set or not penalties
                     else penalties.get(name, getattr(self, name)) for name in PENALTIES}
        params, penalties = sampler_order.in_order(self.samplers, defaults.with_(**sampling), penalties)
        shaping = Shaping(self.logit_bias, rule=self.response_format, **penalties)
        extras = Extras(shaping if shaping.active else None, self.asked_logprobs(), self.tools,
                        (self.tool_choice or "auto") if self.tools else "none", self.prediction,
                        self.parallel_tool_calls)
        speculative, chat = self.speculative or Speculative(), isinstance(self, ChatBody)
        return Request("chat" if chat else "completion",
                       [m.plain() for m in self.messages] if chat else self.prompt,
                       params, self.max_tokens, self.stop, self.stream,
                       bool(self.stream_options.get("include_usage")), self.model,
                       speculative.drafter, speculative.num_draft or self.n_max, extras,
                       self.cache_prompt, self.return_progress and self.stream)


class ChatBody(_Shared, _Messages):
    """A ``POST /v1/chat/completions`` body."""


class CompletionBody(_Shared, _Prompt):
    """A ``POST /v1/completions`` body: a prompt, and the legacy ``logprobs`` (an integer)."""

    logprobs: Annotated[StrictInt, Field(ge=0, le=5)] | None = None
    top_logprobs: Any = None  # (not the legacy API's)

    def asked_logprobs(self) -> int | None:
        """How many alternatives each token's logprobs list; None: no logprobs."""
        return self.logprobs


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
           "total_tokens": stats.prompt_tokens + stats.generated_tokens,
           "prompt_tokens_details": {"cached_tokens": stats.cached_prompt_tokens}}
    if request is not None and request.extras.prediction is not None:
        accepted = stats.accepted_per_drafter.get(PredictedOutput.name, 0)
        out["completion_tokens_details"] = {
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": stats.drafted_per_drafter.get(PredictedOutput.name, 0) - accepted}
    return out


def timings(stats: GenerationStats) -> dict:
    """llama-server's ``timings`` (``cache_n``: prompt tokens reused from the KV cache),
    plus the drafter edgespec used."""
    predicted_ms = stats.decode_time_s * 1000
    prompt_ms = stats.prefill_time_s * 1000
    return {"cache_n": stats.cached_prompt_tokens,
            "cache_restored_n": stats.prompt_restored_tokens,  # of cache_n: from the prompt cache
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
    choice's, shaped by :mod:`edgespec.serve.logprobs` and :mod:`edgespec.serve.tool_calls`)."""
    if request.kind == "chat":
        message = {"role": "assistant", "content": text}
        calls = []
        if tool_names(request.extras):
            message["content"], calls = reply_calls(text, request.extras)
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


def progress(prompt: PromptProgress) -> dict:
    """llama-server's ``prompt_progress``: of ``total`` prompt tokens, ``cache`` reused,
    ``processed`` in the cache now (cached ones included), ``time_ms`` since the
    processing began."""
    return {"total": prompt.total, "cache": prompt.cache, "processed": prompt.processed,
            "time_ms": round(prompt.seconds * 1000)}


def progress_chunk(request: Request, id: str, model: str, prompt: PromptProgress) -> dict:
    """A streamed chunk that only says how far the prompt's processing has come (with
    ``return_progress``), shaped as llama-server sends it: chat, an empty assistant delta."""
    data = chunk(request, id, model, None)
    if request.kind == "chat":
        data["choices"][0]["delta"] = {"role": "assistant", "content": None}
    data["prompt_progress"] = progress(prompt)
    return data


def usage_chunk(request: Request, id: str, model: str, stats: GenerationStats) -> dict:
    """The extra last chunk ``stream_options.include_usage`` asks for (no choices)."""
    return {"id": id, "object": "chat.completion.chunk" if request.kind == "chat" else "text_completion",
            "created": int(time.time()), "model": model, "choices": [], "usage": usage(stats, request)}
