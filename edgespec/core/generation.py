"""What a generation is and yields: its state, its text as streamed chunks, the finished result."""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np

from .cache import PromptProgress
from .coupling import Coupling
from .detokenize import IncrementalDetokenizer, StopMatcher
from .sampling import SamplingParams
from .shaping import Shaping
from .planner import Planner
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
    planner: Planner  # who decides its rounds (its drafter and k)
    finish_reason: str | None = None
    shaping: Shaping | None = None  # a request's bias, penalties, grammar (None: none)
    logprobs: int | None = None  # report log-probabilities, with this many alternatives
    cache_prompt: bool = True  # False: evaluate the whole prompt, reusing no cached state
    progress: Callable[[PromptProgress], None] | None = None  # told while the prompt is processed
    # Set by Engine.cancel() any time after the call that made this run returned.
    cancelled: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class Committed:
    """A token a round committed: whether it was an accepted draft, the kind of drafter
    that drafted it (``"copy"``, ``"model"``; None when the target chose it), and with
    logprobs asked, its entry (:func:`~edgespec.core.shaping.token_logprobs`)."""

    token: int
    from_draft: bool
    draft_kind: str | None = None
    logprobs: dict | None = None


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


_SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "typical_p", "seed")


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


def stream_text(run: Run, tokens: Iterator[Committed], token_bytes: Callable[[int], bytes],
                stop: Sequence[str], models: AbstractContextManager,
                closed: Callable[[], bool]) -> Iterator[Chunk]:
    """The text of a token loop (``tokens``: each token it committed), a chunk per token, cut at the first ``stop`` string; the last chunk
    carries the finish reason and the stats. Each token is taken while holding ``models``
    (the engine's lock on its models) and only while not ``closed()``; the loop is closed
    (its caches rewound) however the stream ends."""
    detok = IncrementalDetokenizer(token_bytes)
    matcher = StopMatcher(stop)
    stopped = False
    try:
        while True:
            with models:  # the models are used only in here, and only while open
                if closed():
                    run.finish_reason = "cancelled"
                    break
                committed = next(tokens, None)
                if committed is None:
                    break
                text, stopped = matcher.feed(detok.add(committed.token))
            yield Chunk(text, [committed.token], committed.from_draft, draft_kind=committed.draft_kind,
                        logprobs=None if run.logprobs is None else [committed.logprobs])
            if stopped:
                run.finish_reason = "stop"
                break
    finally:
        with models:
            tokens.close()  # runs the token loop's cleanup (cache rewind, timings)
    tail = "" if stopped else matcher.flush(detok.flush())
    yield Chunk(tail, [], False, run.finish_reason, run.stats, logprobs=None if run.logprobs is None else [])
