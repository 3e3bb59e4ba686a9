"""llama-server's native endpoints in ``edgespec serve``: ``/props``,
``/completion`` (and ``/completions``), ``/tokenize``, ``/detokenize``, ``/metrics``.

The wire format is :mod:`edgespec.serve.llama_api`'s; a completion runs through
``Server.run`` like an OpenAI one, in the same queue, with the same cancel. All of
them want the API key when one is set, as in llama-server.
"""

from __future__ import annotations

from typing import AsyncIterator, Callable

from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from . import llama_api
from ..core.generation import PromptProgress
from .llama_api import DetokenizeBody, NativeCompletion, TokenizeBody
from .metrics import CONTENT_TYPE
from .http import Whole, body, events, started
from .openai_api import Request
from .request_fields import NATIVE


def add_native_routes(api, server) -> None:
    """Add the native endpoints to ``api`` (the router behind the API key), serving
    ``server`` (a ``Server``)."""
    settings, engine = server.settings, server.engine
    target, model = engine.target, settings.model_names[0]
    chat_template, special = llama_api.chat_template_of(target), llama_api.special_tokens(target)
    draft_model = server.drafters.model.name if server.drafters.model else None
    vocab_size = target.vocab.size

    @api.get("/props")
    async def props():
        params = llama_api.generation_settings(Request("completion", "", settings.defaults, None),
                                               server.drafters.default, settings.num_draft)
        return llama_api.props(
            model=model, model_path=str(target.path or target.name), n_ctx=engine.n_ctx,
            params=params, busy=bool(server.turns and server.turns.busy),
            chat_template=chat_template, special=special,
            speculative=llama_api.speculative(server.drafters.default, settings.num_draft, draft_model))

    @api.post("/completion")
    @api.post("/completions")
    async def completion(native: NativeCompletion = body(NativeCompletion, NATIVE, vocab_size=vocab_size)):
        request, return_tokens = native.request(settings.defaults, settings.penalties), native.return_tokens
        generation = llama_api.generation_settings(
            request, request.drafter or server.drafters.default, request.num_draft or settings.num_draft)
        probs = (lambda entries: llama_api.probabilities(entries, target.token_bytes)) \
            if request.extras.logprobs is not None else None

        def final(chunks: list, streamed: bool) -> dict:
            text = "".join(c.text for c in chunks)
            ids = [t for c in chunks for t in c.token_ids]
            last = chunks[-1]
            stop = llama_api.stop_type(last.finish_reason, text, ids, request.stop, target.token_bytes)
            return llama_api.completion(model, text, ids if return_tokens else [], last.stats, stop,
                                        generation, request.prompt, streamed=streamed,
                                        probs=probs([e for c in chunks for e in c.logprobs or []])
                                        if probs else None)

        stream = await started(server.run(request))
        if request.stream:
            return events(_events(stream, return_tokens, final, probs))
        return Whole(stream, lambda chunks: final(chunks, False))

    @api.post("/tokenize")
    async def tokenize(asked: TokenizeBody = body(TokenizeBody)):
        ids = await run_in_threadpool(llama_api.tokenize, target, asked.content, asked.add_special,
                                      asked.parse_special)
        return {"tokens": llama_api.pieces(ids, target.token_bytes) if asked.with_pieces else ids}

    @api.post("/detokenize")
    async def detokenize(asked: DetokenizeBody = body(DetokenizeBody, vocab_size=vocab_size)):
        return {"content": llama_api.detokenize(asked.tokens, target.token_bytes)}

    @api.get("/metrics")
    async def metrics():
        return Response(server.metrics.exposition(), media_type=CONTENT_TYPE)


async def _events(stream: AsyncIterator, return_tokens: bool, final: Callable[[list, bool], dict],
                  probs: Callable[[list], list] | None) -> AsyncIterator[dict]:
    """A ``/completion`` streamed as llama-server streams it: an event per token with
    its ``content`` and ``"stop": false``, then the final result (``"stop": true``,
    ``timings``), and no ``[DONE]``."""
    chunks, predicted = [], 0
    try:
        async for item in stream:
            if isinstance(item, PromptProgress):  # (only with return_progress)
                yield llama_api.progress_chunk(item)
                continue
            chunks.append(item)
            predicted += len(item.token_ids)
            if item.text or (return_tokens and item.token_ids) or (probs and item.logprobs):
                yield llama_api.completion_chunk(
                    item.text, item.token_ids if return_tokens else [], predicted, item.from_draft,
                    probs(item.logprobs or []) if probs else None)
            if item.finish_reason is not None:
                yield final(chunks, True)
    finally:
        await stream.aclose()  # a client gone: its generation's cancel is set here
