"""Predicted Outputs: a text the caller expects the reply to resemble (OpenAI's
``prediction``, e.g. the file being edited), drafted from.

The drafter keeps a place in the prediction, the token the reply is expected to
say next, and drafts what follows it. Each token the reply commits either is the
one at that place (the place moves on) or is not: an edit, or text around the
prediction such as a code fence or a sentence. After one token the prediction
lacks, the draft guesses that it replaced the one at the place (``add`` renamed
``plus``) and drafts from the token after it; after more, it drafts nothing until
the reply is back on the prediction (a guess there is a long draft thrown away,
which a short reply cannot win back). The place is found again at the next token
that matches: the replaced one's successor, or the prediction's token one or two
past the place (tokens dropped), or else where the reply's last tokens (two or
more) stand in the prediction, the occurrence nearest to the place.
Nearest, not latest as prompt lookup takes it, because an edit's prediction is
followed in order: in a file whose functions differ only by a name or a number,
the latest occurrence of ``return x *`` is almost never the one the reply is at.
One common token (a newline, ``def``) found far away says nothing about the place
and does not move it; where nothing matches, the place stays.

Like every drafter it only proposes: what the reply says is the target's alone.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from ..core.config import DEFAULT_CONFIG, PlannerConfig
from ..core.draft import COPY, Draft, DrafterBase



class PredictedOutput(DrafterBase):
    """Drafts from a predicted reply (token ids); :meth:`expect` sets the next one."""

    name = "prediction"
    kind = COPY

    def __init__(self, prediction: Sequence[int] = (), *, config: PlannerConfig = DEFAULT_CONFIG):
        self.config = config  # prediction_longest_match
        self.expect(prediction)

    def expect(self, prediction: Sequence[int]) -> None:
        """The prediction for the next reply (its prompt is the next context prefilled)."""
        self.prediction = [int(t) for t in prediction]
        self._where = defaultdict(list)  # token -> its positions in the prediction
        for i, token in enumerate(self.prediction):
            self._where[token].append(i)
        self._start: int | None = None  # where the reply starts in the context
        self._restart()

    def reset(self) -> None:
        """Follow the prediction from its start again."""
        self._start = None
        self._restart()

    def _restart(self) -> None:
        self._read = 0   # reply tokens followed so far
        self._place = 0  # the prediction's index of the reply's next token
        self._run = 0    # reply tokens in a row that were the prediction's
        self._missed = 0  # reply tokens since the last that was the prediction's
        self._held = self._broke = 0  # in-step tokens that followed the one before, and breaks

    def prefill(self, context: Sequence[int]) -> int:
        """The first context seen is the prompt: the reply starts after it."""
        if self._start is None or len(context) < self._start:
            self._start = len(context)
        return 0

    def propose(self, context: Sequence[int], num_draft: int, params, rng, *,
                min_confidence: float | None = None) -> Draft:
        """The prediction's tokens after the reply's place in it."""
        self.prefill(context)
        self._follow(context, self._start)
        if self._missed > 1:  # text the prediction lacks (a fence, a sentence): wait for a match
            return Draft([])
        start = self._place + self._missed  # (one token off it: it replaced the one at the place)
        draft = self.prediction[start:start + num_draft]
        if not draft:
            return Draft([])
        # "follow": the reply is in step with the prediction (its last token was the
        # prediction's); "resume": a guess after tokens the prediction lacks. Not prompt
        # lookup's match lengths: two tokens in step with a prediction the caller sent are
        # no coincidence, as a two-token match found anywhere in the context often is.
        bucket = "follow" if self._run else "resume"
        return Draft(draft, None, bucket, hold=[self._hold()] * len(draft))

    def _hold(self) -> float:
        """The chance that a draft's next token holds if the ones before it did: how
        often this reply went on in step with the prediction, from a prior of 9 in 10
        (an edit keeps most of its file)."""
        return (self._held + 9) / (self._held + self._broke + 10)

    def _follow(self, context: Sequence[int], start: int) -> None:
        """Move the place along the reply's tokens (``context`` from ``start``) not read
        yet (from the start again if the reply is shorter than what was read: a rewind)."""
        length = len(context) - start
        if length < self._read:
            self._restart()
        prediction = self.prediction
        for i in range(self._read, length):
            token, place = context[start + i], self._place
            if place < len(prediction) and prediction[place] == token:  # in step (or after an insertion)
                self._held += self._run > 0
                self._place, self._missed, self._run = place + 1, 0, self._run + 1
            elif (found := self._next(token)) is not None:  # after replaced or dropped tokens
                self._broke += self._run > 0  # (dropped tokens broke a run in step)
                self._place, self._missed, self._run = found + 1, 0, 1
            else:
                self._broke += self._run > 0
                self._run = 0
                self._missed += 1
                self._find(list(context[start + max(0, i + 1 - self.config.prediction_longest_match):start + i + 1]))
        self._read = length

    def _next(self, token: int) -> int | None:
        """Where ``token`` continues the prediction just past the place: after the
        tokens the reply replaced (as many as it said off the prediction), or one or
        two prediction tokens further on (dropped); None if not there."""
        prediction, place = self.prediction, self._place
        for j in (place + self._missed, *range(place + 1, place + 3)):
            if j < len(prediction) and prediction[j] == token:
                return j
        return None

    def _find(self, tail: list[int]) -> None:
        """Move the place to just past the occurrence in the prediction of the longest
        suffix of ``tail`` (two tokens or more), the one nearest the old place; stay if
        there is none."""
        best = None  # (match length, -distance, end)
        for end_token in self._where.get(tail[-1], ()):
            length = 1
            while length < len(tail) and end_token - length >= 0 \
                    and self.prediction[end_token - length] == tail[-1 - length]:
                length += 1
            end = end_token + 1
            if length < 2:
                continue  # one common token says nothing about the place
            key = (length, -abs(end - self._place), end)
            if best is None or key > best:
                best = key
        if best is not None:
            self._place, self._run, self._missed = best[2], best[0], 0
