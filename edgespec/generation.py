"""What a generation yields: streamed chunks and the finished result."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from .sampling import SamplingParams
from .stats import GenerationStats


@dataclass
class Chunk:
    """A piece of streamed output.

    ``token_ids`` are the tokens committed with it (one per chunk, except the
    final chunk, which carries none but has ``finish_reason`` and ``stats``).
    ``from_draft`` is True when the token was an accepted draft.
    """

    text: str
    token_ids: list[int]
    from_draft: bool = False
    finish_reason: str | None = None  # "stop", "length" or "cancelled" on the last chunk
    stats: GenerationStats | None = None


@dataclass
class Generation:
    """A finished generation."""

    text: str
    token_ids: list[int]
    from_draft: list[bool]
    finish_reason: str
    stats: GenerationStats


_SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "seed")


def sampling_from(params: SamplingParams | None, options: dict) -> tuple[SamplingParams, dict]:
    """Split sampling fields out of keyword options and merge them into ``params``."""
    fields = {k: options.pop(k) for k in _SAMPLING_FIELDS if k in options}
    params = params or SamplingParams()
    return (params.with_(**fields) if fields else params), options


def collect(chunks: Iterator[Chunk]) -> Generation:
    """Run a stream to its end: the text, tokens and stats it yielded."""
    texts, token_ids, from_draft = [], [], []
    for chunk in chunks:
        texts.append(chunk.text)
        token_ids.extend(chunk.token_ids)
        from_draft.extend([chunk.from_draft] * len(chunk.token_ids))
        if chunk.finish_reason is not None:
            return Generation("".join(texts), token_ids, from_draft, chunk.finish_reason, chunk.stats)
    raise AssertionError("stream ended without a final chunk")
