"""What a request changes in the target's distribution: logit bias, presence and
frequency penalties, llama.cpp's repetition penalty, and a grammar's mask, applied
to the target's logits row by row.

Each is a function of the text before a position, so the target's distribution
with them is as well defined per position as without them, and the exact
acceptance rule still holds: at verify row i the change is computed from the
committed text plus the round's drafts before i, exactly what plain decoding
would have committed before that position had the drafts been its samples.
(The broken variant, penalties counted from the committed text alone, is what
``tests/test_shaping_exactness.py`` shows fails.) The shaped logits then go
through :func:`edgespec.core.sampling.logits_to_probs` like any others.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np

# OpenAI's ranges.
BIAS_RANGE = (-100.0, 100.0)
PENALTY_RANGE = (-2.0, 2.0)
REPEAT_LAST_N = 64  # llama.cpp's default window for its repetition penalty


class TokenRule(Protocol):
    """A constraint on which tokens may come next (a grammar): :mod:`edgespec.core.grammar`."""

    def start(self, target) -> None:
        """Prepare for ``target``'s vocabulary, at the start of a reply."""

    def sync(self, generated: Sequence[int]) -> None:
        """Catch up with the reply committed so far (it only grows between calls)."""

    def admissible(self, drafts: Sequence[int]) -> int:
        """How many leading ``drafts`` the rule allows after the committed reply."""

    def masks(self, drafts: Sequence[int], vocab_size: int) -> np.ndarray:
        """``[len(drafts) + 1, vocab_size]`` booleans: the tokens allowed at each row,
        row i after the committed reply and ``drafts[:i]``."""


@dataclass
class Shaping:
    """A request's changes to the target's distribution (none of them: no change).

    ``logit_bias``: token id -> added to its logit (OpenAI: -100..100).
    ``presence_penalty`` / ``frequency_penalty``: OpenAI's, over the tokens of the
    reply so far: logit[j] -= frequency · count[j] + presence · (count[j] > 0).
    ``repeat_penalty`` / ``repeat_last_n``: llama.cpp's (``llama_sampler_penalties``):
    every token among the last ``repeat_last_n`` of the context, prompt included
    (0: none), has its logit divided by the penalty where positive
    and multiplied by it where not (1: off).
    ``rule``: a grammar (:class:`TokenRule`); tokens it refuses get probability 0.
    """

    logit_bias: dict[int, float] = field(default_factory=dict)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    rule: TokenRule | None = None
    repeat_penalty: float = 1.0
    repeat_last_n: int = REPEAT_LAST_N

    def __post_init__(self) -> None:
        for name, value in (("presence_penalty", self.presence_penalty),
                            ("frequency_penalty", self.frequency_penalty)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) \
                    or not PENALTY_RANGE[0] <= value <= PENALTY_RANGE[1]:
                raise ValueError(f"invalid {name}={value!r}: must be a number from -2 to 2")
        if not isinstance(self.repeat_penalty, (int, float)) or isinstance(self.repeat_penalty, bool) \
                or not 0 < self.repeat_penalty < float("inf"):
            raise ValueError(f"invalid repeat_penalty={self.repeat_penalty!r}: must be a number > 0 "
                             f"(1 switches it off)")
        if not isinstance(self.repeat_last_n, int) or isinstance(self.repeat_last_n, bool) \
                or self.repeat_last_n < 0:
            raise ValueError(f"invalid repeat_last_n={self.repeat_last_n!r}: must be an integer >= 0 "
                             f"(0 switches the penalty off)")
        if not isinstance(self.logit_bias, dict):
            raise ValueError(f"invalid logit_bias={self.logit_bias!r}: must map token ids to numbers")
        for token, bias in self.logit_bias.items():
            if not isinstance(token, int) or isinstance(token, bool) or token < 0:
                raise ValueError(f"invalid logit_bias={token!r}: keys must be token ids")
            if not isinstance(bias, (int, float)) or isinstance(bias, bool) \
                    or not BIAS_RANGE[0] <= bias <= BIAS_RANGE[1]:
                raise ValueError(f"invalid logit_bias={bias!r} for token {token}: must be a number "
                                 f"from -100 to 100")
        self._start = 0
        self._bias_ids = np.array(list(self.logit_bias), dtype=np.int64)
        self._bias = np.array(list(self.logit_bias.values()), dtype=np.float32)

    @property
    def active(self) -> bool:
        """Whether anything changes at all."""
        return bool(self.logit_bias or self.presence_penalty or self.frequency_penalty or self.rule
                    or self.repeats)

    @property
    def repeats(self) -> bool:
        """Whether the repetition penalty changes anything."""
        return self.repeat_penalty != 1.0 and self.repeat_last_n != 0

    def start(self, target, prompt_length: int) -> None:
        """Begin a reply of ``target`` after a prompt of ``prompt_length`` tokens."""
        vocab = target.vocab.size
        bad = [t for t in self.logit_bias if t >= vocab]
        if bad:
            raise ValueError(f"invalid logit_bias={bad[0]!r}: the model's token ids are 0..{vocab - 1}")
        self._start = prompt_length
        if self.rule is not None:
            self.rule.start(target)

    def admissible(self, context: Sequence[int], drafts: Sequence[int]) -> int:
        """How many leading ``drafts`` can be accepted at all (the grammar's cut)."""
        if self.rule is None or not drafts:
            return len(drafts)
        self.rule.sync(context[self._start:])
        return self.rule.admissible(drafts)

    def apply(self, logits: np.ndarray, context: Sequence[int], drafts: Sequence[int]) -> np.ndarray:
        """The shaped rows of ``logits [n, V]`` (a new float32 array): row i is the
        target's logits after ``context`` and ``drafts[:i]``, changed as this asks."""
        return self._shaped(logits, context, drafts, 0)

    def row_after(self, logits: np.ndarray, context: Sequence[int], drafts: Sequence[int]) -> np.ndarray:
        """One row of logits ``[V]`` of a model that drafts, shaped for the position
        after ``context`` and ``drafts`` (a draft model's q, masked and penalised as the
        target's p will be there, so that its drafts are not wasted)."""
        return self._shaped(np.asarray(logits)[None], context, drafts, len(drafts))[0]

    def _shaped(self, logits: np.ndarray, context: Sequence[int], drafts: Sequence[int],
                first: int) -> np.ndarray:
        """Rows of ``logits``, row i after ``context`` and ``drafts[:first + i]``, shaped."""
        out = np.array(logits, dtype=np.float32)  # (a copy: the backend's rows stay as they were)
        rows, vocab = out.shape
        if len(self._bias_ids):
            keep = self._bias_ids < vocab
            out[:, self._bias_ids[keep]] += self._bias[keep]
        if self.repeats:  # (before presence and frequency, as llama.cpp's penalties apply them)
            self._repeat(out, context, drafts, first)
        if self.presence_penalty or self.frequency_penalty:
            counts = Counter([*context[self._start:], *drafts[:first]])
            for i in range(rows):
                self._penalize(out[i], counts)
                if first + i < len(drafts):
                    counts[drafts[first + i]] += 1  # the next row comes after this draft
        if self.rule is not None:
            self.rule.sync(context[self._start:])
            out[~self.rule.masks(list(drafts[:first + rows - 1]), vocab)[first:]] = -np.inf
        return out

    def _repeat(self, out: np.ndarray, context: Sequence[int], drafts: Sequence[int], first: int) -> None:
        """llama.cpp's repetition penalty: row i over the last ``repeat_last_n`` tokens
        before it, the context's and the round's drafts before row ``first + i``."""
        window = self.repeat_last_n
        tail = list(context[-window:])
        for i in range(out.shape[0]):
            ids = np.unique(np.asarray([*tail, *drafts[:first + i]][-window:], dtype=np.int64))
            ids = ids[ids < out.shape[1]]
            values = out[i, ids]
            out[i, ids] = np.where(values <= 0, values * self.repeat_penalty, values / self.repeat_penalty)

    def _penalize(self, row: np.ndarray, counts: Counter) -> None:
        if not counts:
            return
        ids = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
        times = np.fromiter(counts.values(), dtype=np.float32, count=len(counts))
        keep = ids < row.shape[-1]
        row[ids[keep]] -= self.frequency_penalty * times[keep] + self.presence_penalty


def log_softmax(row: np.ndarray) -> np.ndarray:
    """log p of every token of one row of logits (float64: small logprobs stay exact)."""
    row = np.asarray(row, dtype=np.float64)
    top = row.max()
    with np.errstate(divide="ignore"):
        return row - top - np.log(np.exp(row - top).sum())


def token_logprobs(logits: np.ndarray, token_ids: Sequence[int], top: int) -> list[dict]:
    """For each committed token (row i of ``logits`` decided token i): its log
    probability and the ``top`` most likely tokens with theirs, as
    ``{"id", "logprob", "top": [(id, logprob), ...]}``."""
    out = []
    for i, token in enumerate(token_ids):
        if i >= len(logits):
            break
        logp = log_softmax(logits[i])
        best = np.argpartition(-logp, top)[:top] if 0 < top < len(logp) else np.arange(len(logp) if top else 0)
        best = best[np.argsort(-logp[best], kind="stable")]
        out.append({"id": int(token), "logprob": float(logp[token]),
                    "top": [(int(j), float(logp[j])) for j in best]})
    return out
