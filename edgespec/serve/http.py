"""What the server's routes share, the OpenAI ones and llama-server's native ones:
the API key (a dependency of the router they are on), a body read into its pydantic
model, a generation started, and its chunks sent as server-sent events or as one JSON
body once whole. Both go out as Starlette's streaming response, which listens for
the client going away meanwhile and then stops, and so cancels, the generation."""

from __future__ import annotations

import hmac
import json
from typing import AsyncIterator, Callable

from fastapi import Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.sse import EventSourceResponse, format_sse_event
from pydantic import BaseModel, ValidationError

from . import request_fields
from .errors import ApiError, bad_request

# What llama-server leaves open when it has an API key (its middleware's public
# paths, but for the model list, which edgespec has always kept behind the key).
OPEN_PATHS = ("/health", "/v1/health")


def api_key(key: str | None):
    """The dependency that refuses (401) a request without ``key``: ``Authorization:
    Bearer KEY`` or, as llama-server also takes it, ``X-Api-Key: KEY``."""
    async def authorize(http_request: Request) -> None:
        if key is None:
            return
        header = http_request.headers.get("authorization", "")
        given = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else \
            http_request.headers.get("x-api-key", "")
        if not hmac.compare_digest(given.encode(), key.encode()):
            raise ApiError(401, "missing or wrong API key: send Authorization: Bearer KEY",
                           code="invalid_api_key")
    return Depends(authorize)


def body(model: type[BaseModel], route: str | None = None, **context):
    """The dependency that reads a request's JSON body (its Content-Type, size and
    origin already checked by :mod:`~edgespec.serve.guard`) into ``model``, validated with ``context``; a 400 names the first field at fault.
    ``route``: a completion route of :mod:`~edgespec.serve.request_fields`, whose
    table is checked first (refused fields, unknown ones logged)."""
    async def read(http_request: Request):
        try:
            data = json.loads(await http_request.body())
        except (ValueError, RecursionError):
            raise ApiError(400, "the request body is not valid JSON") from None
        if route is not None:
            request_fields.check(route, data)
        try:
            return model.model_validate(data, context=context)
        except ValidationError as exc:
            raise bad_request(exc) from None
    return Depends(read)


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


def events(stream: AsyncIterator[dict | str]) -> EventSourceResponse:
    """Server-sent events: each dict of ``stream`` as JSON, a string (``[DONE]``) as it is."""
    async def encoded():
        async for data in stream:
            yield format_sse_event(data_str=data if isinstance(data, str) else
                                   json.dumps(data, ensure_ascii=False))
    return EventSourceResponse(encoded(), headers={"Cache-Control": "no-cache"})


class Whole(StreamingResponse):
    """A generation collected whole, then ``build(chunks)`` sent as one JSON body (null
    when the server shut down meanwhile). The collecting runs inside the response, where
    Starlette listens for the client going away (ASGI before 2.4, which uvicorn speaks)
    and cancels it then, and so the generation."""

    def __init__(self, stream: AsyncIterator, build: Callable[[list], dict]):
        super().__init__(stream)
        self.build = build

    async def stream_response(self, send) -> None:
        try:
            chunks = [item async for item in self.body_iterator]
        finally:
            await self.body_iterator.aclose()  # (a client gone: the generation's cancel is set)
        whole = JSONResponse(self.build(chunks) if chunks and chunks[-1].finish_reason is not None
                             else None)
        await send({"type": "http.response.start", "status": 200, "headers": whole.raw_headers})
        await send({"type": "http.response.body", "body": whole.body})
