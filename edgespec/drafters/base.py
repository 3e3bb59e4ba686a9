"""The drafter protocol: propose up to k tokens, with their q or None."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from ..sampling import SamplingParams


@dataclass
class Draft:
    """Proposed tokens and the distribution each was sampled from.

    ``probs`` is ``[len(token_ids), V]``, or ``None`` for a deterministic
    drafter (q one-hot on each proposed token).
    """

    token_ids: list[int]
    probs: np.ndarray | None = None
    match_length: int = 0  # prompt lookup: length of the n-gram that matched

    def __len__(self) -> int:
        return len(self.token_ids)


@runtime_checkable
class Drafter(Protocol):
    """Anything that proposes draft tokens for a context.

    ``propose`` may return fewer than ``num_draft`` tokens, or none. Draft
    tokens must be *sampled from the q they report* under ``params``.
    ``accepted`` tells the drafter how many of its last proposal the target
    kept, so it can learn (or simply ignore it). ``prefill`` prepares for a
    new prompt ahead of the first round (returns tokens evaluated), and
    ``rewind`` drops any state beyond the committed ``context``; the engine
    calls it in a ``finally`` so an abandoned generation leaves no junk.
    """

    name: str

    def prefill(self, context: Sequence[int]) -> int: ...

    def propose(self, context: Sequence[int], num_draft: int, params: SamplingParams,
                rng: np.random.Generator) -> Draft: ...

    def accepted(self, num_accepted: int) -> None: ...

    def rewind(self, context: Sequence[int]) -> None: ...

    def reset(self) -> None: ...
