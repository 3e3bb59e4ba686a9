"""What the server's routes share, the OpenAI ones and llama-server's native ones:
the API key, the JSON body, a generation started, streamed as events or
collected whole (a client that goes away meanwhile cancels it)."""

from __future__ import annotations

import asyncio
import hmac
import json
from typing import AsyncIterator, Callable

from .openai_api import ApiError

# What llama-server leaves open when it has an API key (its middleware's public
# paths, but for the model list, which edgespec has always kept behind the key).
OPEN_PATHS = ("/health", "/v1/health")


def authorize(api_key: str | None, http_request) -> None:
    """Refuse (401) a request without the key: ``Authorization: Bearer KEY`` or, as
    llama-server also takes it, ``X-Api-Key: KEY``."""
    if api_key is None:
        return
    header = http_request.headers.get("authorization", "")
    given = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else \
        http_request.headers.get("x-api-key", "")
    if not hmac.compare_digest(given.encode(), api_key.encode()):
        raise ApiError(401, "missing or wrong API key: send Authorization: Bearer KEY",
                       code="invalid_api_key")


async def read_json(http_request):
    try:
        return json.loads(await http_request.body())
    except (ValueError, RecursionError):
        raise ApiError(400, "the request body is not valid JSON") from None


def sse(data: dict) -> str:
    """One server-sent event."""
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


async def started(chunks: AsyncIterator) -> AsyncIterator:
    """A generation's chunks (``Server.run``), the first one awaited here: what goes
    wrong before the generation starts (a full queue, a bad prompt) raises now, while
    a status can still say so. The iterator returned yields every chunk, the first
    too; closing it closes ``chunks``, which sets the generation's cancel."""
    first = await chunks.__anext__()  # waits for a turn

    async def every():
        try:
            yield first
            async for item in chunks:  # (it ends early only when the server shuts down)
                yield item
        finally:
            await chunks.aclose()
    return every()


async def whole(stream: AsyncIterator, http_request, build: Callable[[list], dict]):
    """Collect a whole generation, then ``build(chunks)`` the response; None when the
    client disconnected meanwhile (which cancelled the generation) or the server is
    shutting down."""
    async def collect():
        chunks = [item async for item in stream]
        return build(chunks) if chunks and chunks[-1].finish_reason is not None else None

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
        await stream.aclose()  # (a client gone: its generation's cancel is set here)
    if result.cancelled():
        return None  # nobody is listening
    return result.result()
