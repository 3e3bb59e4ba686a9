"""llama-server's native endpoints in ``edgespec serve``: ``/props``,
``/completion`` (and ``/completions``), ``/tokenize``, ``/detokenize``, ``/metrics``.

The wire format is :mod:`edgespec.serve.llama_api`'s; a completion runs through
``Server.run`` like an OpenAI one, in the same queue, with the same cancel. All of
them want the API key when one is set, as in llama-server.
"""

from __future__ import annotations

from typing import AsyncIterator, Callable

from fastapi import Request as HttpRequest
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from . import llama_api
from .metrics import CONTENT_TYPE
from .http import authorize, read_json, sse, started, whole


def add_native_routes(app, server) -> None:
    """Add the native endpoints to ``app``, serving ``server`` (a ``Server``)."""
    settings, engine = server.settings, server.engine
    target, model = engine.target, settings.model_names[0]
    chat_template, special = llama_api.chat_template_of(target), llama_api.special_tokens(target)
    draft_model = server.drafters.model.name if server.drafters.model else None

    @app.get("/props")
    async def props(http_request: HttpRequest):
        authorize(settings.api_key, http_request)
        params = llama_api.generation_settings(settings.defaults, None, [], False,
                                               server.drafters.default, settings.num_draft)
        return llama_api.props(
            model=model, model_path=str(target.path or target.name), n_ctx=engine.n_ctx,
            params=params, busy=bool(server.turns and server.turns.busy),
            chat_template=chat_template, special=special,
            speculative=llama_api.speculative(server.drafters.default, settings.num_draft, draft_model))

    @app.post("/completion")
    @app.post("/completions")
    async def completion(http_request: HttpRequest):
        authorize(settings.api_key, http_request)
        request, return_tokens = llama_api.parse_completion(await read_json(http_request),
                                                            settings.defaults)
        generation = llama_api.generation_settings(
            request.params, request.max_tokens, request.stop, request.stream,
            request.drafter or server.drafters.default, request.num_draft or settings.num_draft)

        def final(chunks: list, streamed: bool) -> dict:
            text = "".join(c.text for c in chunks)
            ids = [t for c in chunks for t in c.token_ids]
            last = chunks[-1]
            stop = llama_api.stop_type(last.finish_reason, text, ids, request.stop, target.token_bytes)
            return llama_api.completion(model, text, ids if return_tokens else [], last.stats, stop,
                                        generation, request.prompt, streamed=streamed)

        stream = await started(server.run(request))
        if request.stream:
            return StreamingResponse(_events(stream, return_tokens, final),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await whole(stream, http_request, lambda chunks: final(chunks, False))

    @app.post("/tokenize")
    async def tokenize(http_request: HttpRequest):
        authorize(settings.api_key, http_request)
        content, add_special, parse_special, with_pieces = \
            llama_api.parse_tokenize(await read_json(http_request))
        ids = await run_in_threadpool(llama_api.tokenize, target, content, add_special, parse_special)
        return {"tokens": llama_api.pieces(ids, target.token_bytes) if with_pieces else ids}

    @app.post("/detokenize")
    async def detokenize(http_request: HttpRequest):
        authorize(settings.api_key, http_request)
        ids = llama_api.parse_detokenize(await read_json(http_request), target.vocab.size)
        return {"content": llama_api.detokenize(ids, target.token_bytes)}

    @app.get("/metrics")
    async def metrics(http_request: HttpRequest):
        authorize(settings.api_key, http_request)
        return Response(server.metrics.exposition(), media_type=CONTENT_TYPE)


async def _events(stream: AsyncIterator, return_tokens: bool,
                  final: Callable[[list, bool], dict]) -> AsyncIterator[str]:
    """A ``/completion`` streamed as llama-server streams it: an event per token with
    its ``content`` and ``"stop": false``, then the final result (``"stop": true``,
    ``timings``), and no ``[DONE]``."""
    chunks, predicted = [], 0
    try:
        async for item in stream:
            chunks.append(item)
            predicted += len(item.token_ids)
            if item.text or (return_tokens and item.token_ids):
                yield sse(llama_api.completion_chunk(
                    item.text, item.token_ids if return_tokens else [], predicted, item.from_draft))
            if item.finish_reason is not None:
                yield sse(final(chunks, True))
    finally:
        await stream.aclose()  # a client gone: its generation's cancel is set here
