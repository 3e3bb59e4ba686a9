"""How a generation's chunks become an OpenAI reply: events as they come (sent as
server-sent events by :func:`edgespec.serve.http.events`), or one JSON body at the end;
tool calls and log-probabilities in OpenAI's shapes."""

from __future__ import annotations

from typing import AsyncIterator, Callable

from ..core.generation import PromptProgress
from .openai_api import Request, chunk, progress_chunk, response, usage_chunk
from .logprobs import chat_logprobs, completion_logprobs
from .tool_calls import may_be_call, reply_calls, tool_names


def logprobs_of(request: Request, entries: list[dict] | None, token_bytes, offset: int = 0) -> dict | None:
    """A choice's ``logprobs`` from the engine's entries (None: not asked for)."""
    if entries is None:
        return None
    return chat_logprobs(entries, token_bytes) if request.kind == "chat" else \
        completion_logprobs(entries, token_bytes, offset)


async def stream_reply(request: Request, id: str, model: str, stream: AsyncIterator,
                       token_bytes) -> AsyncIterator[dict | str]:
    """The events: the prompt's progress if asked, a chunk per token, the finish, usage
    if asked, ``[DONE]``.
    With tools, a reply's start that may be a tool call is held back; the calls go
    out as one delta before the finish."""
    names = tool_names(request.extras) if request.kind == "chat" else []
    held, holding, whole, sent = "", bool(names), [], 0
    try:
        if request.kind == "chat":
            yield chunk(request, id, model, "", first=True)
        async for item in stream:
            if isinstance(item, PromptProgress):  # (only with return_progress)
                yield progress_chunk(request, id, model, item)
                continue
            whole.append(item.text)
            text = item.text
            if holding:  # the reply so far may still be a tool call: not sent yet
                held, text = held + text, ""
                if not may_be_call(held):
                    text, held, holding = held, "", False
            if item.finish_reason is not None:
                calls = reply_calls("".join(whole), request.extras)[1] if names else []
                text += held if not calls else ""
                if text:
                    yield chunk(request, id, model, text)
                yield chunk(request, id, model, None, reason=item.finish_reason, stats=item.stats,
                            tool_calls=calls or None)
                if request.include_usage:
                    yield usage_chunk(request, id, model, item.stats)
                yield "[DONE]"
                return
            if text or item.logprobs:
                yield chunk(request, id, model, text, from_draft=item.from_draft,
                            draft_kind=item.draft_kind,
                            logprobs=logprobs_of(request, item.logprobs, token_bytes, sent))
                sent += len(item.text)
    finally:
        await stream.aclose()  # a client gone: its generation's cancel is set here


def whole_reply(request: Request, id: str, model: str, token_bytes) -> Callable[[list], dict]:
    """What builds a whole (non-streamed) reply from a generation's chunks."""
    def build(chunks: list) -> dict:
        last = chunks[-1]
        entries = [e for c in chunks for e in (c.logprobs or [])]
        logprobs = logprobs_of(request, None if last.logprobs is None else entries, token_bytes)
        return response(request, id, model, "".join(c.text for c in chunks), last.finish_reason,
                        last.stats, logprobs=logprobs)
    return build
