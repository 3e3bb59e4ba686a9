"""Predicted Outputs: a text the caller expects the reply to resemble (OpenAI's
``prediction``, e.g. the file being edited), drafted from.

While the reply so far equals the prediction's beginning, the draft is the
prediction's next tokens; once they part, prompt lookup over the prediction
followed by the reply finds where the reply picked the prediction up again (an
edit's unchanged lines after a changed one). Like every drafter it only
proposes: what the reply says is the target's alone.
"""

from __future__ import annotations

from typing import Sequence

from .base import COPY, Draft, DrafterBase
from .copying import match_bucket
from .prompt_lookup import PromptLookup


class PredictedOutput(DrafterBase):
    """Drafts from a predicted reply (token ids); :meth:`expect` sets the next one."""

    name = "prediction"
    kind = COPY

    def __init__(self, prediction: Sequence[int] = ()):
        self.lookup = PromptLookup()
        self.expect(prediction)

    def expect(self, prediction: Sequence[int]) -> None:
        """The prediction for the next reply (its prompt is the next context prefilled)."""
        self.prediction = [int(t) for t in prediction]
        self._start: int | None = None  # where the reply starts in the context
        self.lookup.reset()

    def attach(self, target) -> None:
        """As prompt lookup (line ends from the target's vocabulary)."""
        self.lookup.attach(target)

    def prefill(self, context: Sequence[int]) -> int:
        """The first context seen is the prompt: the reply starts after it."""
        if self._start is None or len(context) < self._start:
            self._start = len(context)
        return 0

    def propose(self, context: Sequence[int], num_draft: int, params, rng, *,
                min_confidence: float | None = None) -> Draft:
        """The prediction's next tokens while the reply follows it; else a lookup."""
        self.prefill(context)
        reply = list(context[self._start:])
        done = len(reply)
        if self.prediction[:done] == reply:  # classed by how far the reply has followed it
            return Draft(self.prediction[done:done + num_draft], None, match_bucket(max(done, 2)))
        return self.lookup.propose(self.prediction + reply, num_draft, params, rng)
