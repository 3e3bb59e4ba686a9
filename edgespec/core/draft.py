"""The drafter protocol: propose up to k tokens, with their q or None."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from .sampling import SamplingParams


@dataclass
class Draft:
    """Proposed tokens and the distribution each was sampled from.

    ``probs`` is ``[len(token_ids), V]``, or ``None`` for a deterministic
    drafter (q one-hot on each proposed token). With ``scales``, ``probs``
    holds q only up to a factor per row: q = probs × scale (a drafter that
    samples from unnormalised rows saves a pass over the vocabulary).
    """

    token_ids: list[int]
    probs: np.ndarray | None = None
    # What kind of draft this is, for planners that track acceptance separately by
    # kind (prompt lookup: how long a match it continues); None: all alike.
    bucket: str | None = None
    # How sure the drafter was of each token (a draft model: its top probability
    # before sampling it), for planners that learn where drafting stops paying.
    confidence: list[float] | None = None
    scales: np.ndarray | None = None
    # A copying drafter's own estimate, per token, of the chance that it is accepted if
    # the ones before it were (where copies of this kind broke off in this text).
    hold: list[float] | None = None

    def __len__(self) -> int:
        return len(self.token_ids)

    def truncated(self, num_draft: int) -> "Draft":
        """The first ``num_draft`` tokens of this draft (with their q)."""
        if num_draft >= len(self.token_ids):
            return self
        probs = None if self.probs is None else self.probs[:num_draft]
        confidence = None if self.confidence is None else self.confidence[:num_draft]
        scales = None if self.scales is None else self.scales[:num_draft]
        hold = None if self.hold is None else self.hold[:num_draft]
        return Draft(self.token_ids[:num_draft], probs, self.bucket, confidence, scales, hold)


# What a drafter is, for a planner (Drafter.kind):
COPY = "copy"    # drafts the text's own tokens (q one-hot, probs=None), at no model cost:
#                  prompt lookup, the suffix drafter; it classes its drafts (Draft.bucket)
MODEL = "model"  # a model of its own: q for each token, a step cost, a confidence stop

# How stats name a generation with no drafter (GenerationStats.drafter): the registry's
# ``-d none`` (drafters/registry.py), defined here, below it, for the engine's stats.
NO_DRAFTER = "none"


@runtime_checkable
class Drafter(Protocol):
    """Anything that proposes draft tokens for a context.

    ``kind`` is :data:`COPY` or :data:`MODEL`: what a planner needs to know of a
    drafter (how to track it, whether a confidence stop applies); nothing asks
    its name for that. ``propose`` may return fewer than ``num_draft`` tokens,
    or none. ``min_confidence``: where a draft model stops for this proposal
    (its own top probability before a token; None: its own setting); a copying
    drafter ignores it. Draft tokens must be *sampled from the q they report*
    under ``params``.
    ``accepted`` tells the drafter how many of its last proposal the target
    kept, so it can learn (or simply ignore it). ``prefill`` brings the
    drafter up to date with ``context`` (the prompt, or the tokens committed
    since it last drafted) and returns how many tokens it evaluated; the
    engine times it apart from ``propose``. ``rewind`` drops any state beyond
    the committed ``context``; the engine calls it in a ``finally`` so an
    abandoned generation leaves no junk. ``reset`` forgets the current
    conversation, ``forget`` everything learned from earlier ones too.
    ``memory`` counts the bytes it holds beyond the models (what it keeps of other
    conversations too), and ``drop_oldest_memory`` drops the least recently used of
    those (``oldest_memory``: when it was last used), under the prompt cache's budget.
    ``attach`` raises :class:`~edgespec.errors.EdgespecError` if the drafter
    cannot serve ``target`` (vocabulary), and ``close`` frees what the drafter holds.

    What the engine, a planner, bench and the server read of a drafter beyond
    that: ``n_ctx``, the context it can hold (None: no limit of its own);
    ``min_confidence``, a draft model's own stop (None: none); ``cache``, the
    :class:`~edgespec.core.cache.CachedModel` a draft model drafts through (timed with
    the target; None for a drafter that runs no model). :class:`DrafterBase`
    gives every member but ``propose`` a default.
    """

    name: str
    kind: str
    n_ctx: int | None
    min_confidence: float | None
    cache: object | None

    def attach(self, target) -> None: ...

    def prefill(self, context: Sequence[int]) -> int: ...

    def propose(self, context: Sequence[int], num_draft: int, params: SamplingParams,
                rng: np.random.Generator, *, min_confidence: float | None = None) -> Draft: ...

    def accepted(self, num_accepted: int) -> None: ...

    def rewind(self, context: Sequence[int]) -> None: ...

    def reset(self) -> None: ...

    def forget(self) -> None: ...

    def memory(self) -> dict[str, int]: ...

    def oldest_memory(self) -> float | None: ...

    def drop_oldest_memory(self) -> None: ...

    def close(self) -> None: ...


class DrafterBase:
    """Defaults for a drafter that runs no model and keeps no state outside the
    context it is handed: subclass it and write ``name``, ``kind`` and ``propose``
    (docs/drafters.md adds one in a file of its own)."""

    name: str = "drafter"
    kind: str = COPY
    n_ctx: int | None = None
    min_confidence: float | None = None
    cache = None
    shapes_q = False  # True: propose() takes shaping= (a request's bias, penalties, grammar)

    def attach(self, target) -> None:
        """Any target will do."""

    def prefill(self, context: Sequence[int]) -> int:
        """No model runs: nothing is evaluated."""
        return 0

    def accepted(self, num_accepted: int) -> None:
        """Nothing to learn from a verdict."""

    def rewind(self, context: Sequence[int]) -> None:
        """Nothing beyond the committed context to drop."""

    def reset(self) -> None:
        """Nothing of this conversation to forget."""

    def forget(self) -> None:
        """Forget everything: this conversation and earlier ones."""
        self.reset()

    def memory(self) -> dict[str, int]:
        """Bytes of host memory it holds beyond the models, by part (``copy_indexes``,
        ``suffix_counts``, ``draft_logits``): counted in the prompt cache's budget."""
        return {}

    def oldest_memory(self) -> float | None:
        """When (``time.monotonic()``) the least recently used piece of it that may be
        dropped, another conversation's, was last used; None: none."""
        return None

    def drop_oldest_memory(self) -> None:
        """Drop that piece (:meth:`oldest_memory`): the budget is full."""

    def close(self) -> None:
        """Nothing to free."""
