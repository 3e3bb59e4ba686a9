"""What a generation is and yields: its state, its text as streamed chunks, the finished result."""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np

from .coupling import Coupling
from .detokenize import IncrementalDetokenizer, StopMatcher
from .sampling import SamplingParams
from .shaping import Shaping
from .stats import GenerationStats


@dataclass(eq=False)
class Run:
    """The state of one generation, shared by the token loop and its caller."""

    context: list[int]
    params: SamplingParams
    rng: np.random.Generator | Coupling  # (a Coupling: seed-invariant sampling)
    max_tokens: int
    speculative: bool
    stats: GenerationStats
    n_ctx: int  # the context it may fill (Engine.n_ctx)
    finish_reason: str | None = None
    shaping: Shaping | None = None  # a request's bias, penalties, grammar (None: none)
    logprobs: int | None = None  # report log-probabilities, with this many alternatives
    # With logprobs: per generated token, in order, what shaping.token_logprobs gives.
    token_logprobs: list[dict] = field(default_factory=list)
    draft_kind: str | None = None  # the kind of drafter (COPY, MODEL) of the latest round, or None
    # Set by Engine.cancel() any time after the call that made this run returned.
    cancelled: threading.Event = field(default_factory=threading.Event)


@dataclass
class Chunk:
    """A piece of streamed output.

    ``token_ids`` are the tokens committed with it (one per chunk, except the
    final chunk, which carries none but has ``finish_reason`` and ``stats``).
    ``from_draft`` is True when the token was an accepted draft, and ``draft_kind``
    then says what kind of drafter drafted it (``"copy"`` or ``"model"``).
    """

    text: str
    token_ids: list[int]
    from_draft: bool = False
    finish_reason: str | None = None  # "stop", "length" or "cancelled" on the last chunk
    stats: GenerationStats | None = None
    logprobs: list[dict] | None = None  # with logprobs asked: an entry per token id
    draft_kind: str | None = None


@dataclass
class Generation:
    """A finished generation."""

    text: str
    token_ids: list[int]
    from_draft: list[bool]
    finish_reason: str
    stats: GenerationStats
    logprobs: list[dict] | None = None  # with logprobs asked: an entry per token id


_SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "seed")


def sampling_from(params: SamplingParams | None, options: dict) -> tuple[SamplingParams, dict]:
    """Split sampling fields out of keyword options and merge them into ``params``."""
    fields = {k: options.pop(k) for k in _SAMPLING_FIELDS if k in options}
    params = params or SamplingParams()
    return (params.with_(**fields) if fields else params), options


def collect(chunks: Iterator[Chunk]) -> Generation:
    """Run a stream to its end: the text, tokens and stats it yielded."""
    texts, token_ids, from_draft, logprobs = [], [], [], []
    for chunk in chunks:
        texts.append(chunk.text)
        token_ids.extend(chunk.token_ids)
        from_draft.extend([chunk.from_draft] * len(chunk.token_ids))
        logprobs.extend(chunk.logprobs or [])
        if chunk.finish_reason is not None:
            return Generation("".join(texts), token_ids, from_draft, chunk.finish_reason, chunk.stats,
                              None if chunk.logprobs is None else logprobs)
    raise AssertionError("stream ended without a final chunk")


def stream_text(run: Run, tokens: Iterator[tuple[int, bool]], token_bytes: Callable[[int], bytes],
                stop: Sequence[str], models: AbstractContextManager,
                closed: Callable[[], bool]) -> Iterator[Chunk]:
    """The text of a token loop (``tokens``: each committed token and whether it was an
    accepted draft), a chunk per token, cut at the first ``stop`` string; the last chunk
    carries the finish reason and the stats. Each token is taken while holding ``models``
    (the engine's lock on its models) and only while not ``closed()``; the loop is closed
    (its caches rewound) however the stream ends."""
    detok = IncrementalDetokenizer(token_bytes)
    matcher = StopMatcher(stop)
    stopped, produced = False, 0
    try:
        while True:
            with models:  # the models are used only in here, and only while open
                if closed():
                    run.finish_reason = "cancelled"
                    break
                item = next(tokens, None)
                if item is None:
                    break
                token, from_draft = item
                text, stopped = matcher.feed(detok.add(token))
                logprobs = None if run.logprobs is None else run.token_logprobs[produced:produced + 1]
                produced += 1
            yield Chunk(text, [token], from_draft, draft_kind=run.draft_kind if from_draft else None,
                        logprobs=logprobs)
            if stopped:
                run.finish_reason = "stop"
                break
    finally:
        with models:
            tokens.close()  # runs the token loop's cleanup (cache rewind, timings)
    tail = "" if stopped else matcher.flush(detok.flush())
    yield Chunk(tail, [], False, run.finish_reason, run.stats, logprobs=None if run.logprobs is None else [])
