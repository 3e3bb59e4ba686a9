"""How a generation's chunks become an HTTP reply: server-sent events as they come,
or one JSON body at the end; tool calls and log-probabilities in OpenAI's shapes."""

from __future__ import annotations

import asyncio
import json
from typing import AsyncIterator

from .openai_api import Request, chunk, response, usage_chunk
from .openai_fields import chat_logprobs, completion_logprobs, may_be_call, split_tool_calls, tool_names


def logprobs_of(request: Request, entries: list[dict] | None, token_bytes, offset: int = 0) -> dict | None:
    """A choice's ``logprobs`` from the engine's entries (None: not asked for)."""
    if entries is None:
        return None
    return chat_logprobs(entries, token_bytes) if request.kind == "chat" else \
        completion_logprobs(entries, token_bytes, offset)


async def stream_reply(request: Request, id: str, model: str, first, chunks,
                       token_bytes) -> AsyncIterator[str]:
    """Server-sent events: a chunk per token, the finish, usage if asked, ``[DONE]``.
    With tools, a reply's start that may be a tool call is held back; the calls go
    out as one delta before the finish."""
    def event(data: dict) -> str:
        return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"

    names = tool_names(request.extras) if request.kind == "chat" else []
    held, holding, whole, sent = "", bool(names), [], 0
    try:
        if request.kind == "chat":
            yield event(chunk(request, id, model, "", first=True))
        item = first
        while True:
            whole.append(item.text)
            text = item.text
            if holding:  # the reply so far may still be a tool call: not sent yet
                held, text = held + text, ""
                if not may_be_call(held):
                    text, held, holding = held, "", False
            if item.finish_reason is not None:
                calls = split_tool_calls("".join(whole), names)[1] if names else []
                text += held if not calls else ""
                if text:
                    yield event(chunk(request, id, model, text))
                yield event(chunk(request, id, model, None, reason=item.finish_reason, stats=item.stats,
                                  tool_calls=calls or None))
                if request.include_usage:
                    yield event(usage_chunk(request, id, model, item.stats))
                yield "data: [DONE]\n\n"
                return
            if text or item.logprobs:
                yield event(chunk(request, id, model, text, from_draft=item.from_draft,
                                  logprobs=logprobs_of(request, item.logprobs, token_bytes, sent)))
                sent += len(item.text)
            try:
                item = await chunks.__anext__()
            except StopAsyncIteration:  # the server is shutting down mid-generation
                return
    finally:
        await chunks.aclose()  # a client gone: its generation's cancel is set here


async def whole_reply(request: Request, id: str, model: str, first, chunks, http_request, token_bytes):
    """Collect a whole generation; a client that disconnects meanwhile cancels it."""
    async def collect():
        texts, entries, item = [], [], first
        while item.finish_reason is None:
            texts.append(item.text)
            entries += item.logprobs or []
            item = await chunks.__anext__()
        texts.append(item.text)
        logprobs = logprobs_of(request, None if item.logprobs is None else entries, token_bytes)
        return response(request, id, model, "".join(texts), item.finish_reason, item.stats,
                        logprobs=logprobs)

    async def disconnected():
        while (await http_request.receive())["type"] != "http.disconnect":
            pass

    result, gone = asyncio.ensure_future(collect()), asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (gone, result):
            if not task.done():
                task.cancel()
        await asyncio.gather(result, gone, return_exceptions=True)
        await chunks.aclose()  # (a client gone: its generation's cancel is set here)
    if result.cancelled():
        return None  # nobody is listening
    return result.result()
