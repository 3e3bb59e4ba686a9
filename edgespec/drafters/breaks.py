"""Where copies break: the chance that a copy in progress ends at each token it would draft.

A reply that returns a file with edits copies the file and breaks off where an edit
is. Two things tell where, both learned from the committed text itself (every token
committed while a copy was followed says whether the copy held there):

- **how long the copy has held.** Copies are long or short, rarely in between: in
  the replies real clients get (``client`` requests), a copy that has held for 2-3
  tokens breaks at the next one a third of the time, one that has held for 16 about
  one time in 35, one that has held for 128 one time in 200. So a copy's later tokens
  are surer than its first, and a long copy is worth drafting far;
- **what the source holds there.** Breaks recur where the source looks alike: at
  each ``def`` line when type hints are added, at each use of a name being renamed,
  after each function's first line when docstrings are added. A kind of line (a token
  with its line's first word; a line's first word with the word the line before began
  with) that broke copies going through it stands for itself: two ``def`` lines that
  broke make the third likely to. A token's own features (it; it and the token before)
  raise the chance by the breaks seen there over the breaks the copies' lengths
  predicted there, as a name being renamed does wherever it occurs; a feature that held
  lowers nothing (how long the copy has held says that already, and in text that
  repeats common tokens a copy that merely looks familiar would seem safe).

:class:`BreakModel` holds both; :class:`SourceLines` gives the features of a position.
"""

from __future__ import annotations

from typing import Callable, Hashable, Sequence

from ..core.config import DEFAULT_CONFIG

# Classes of how long a copy has held (tokens, its backward match included); the chance
# that it breaks at the next token in each, before this text says otherwise, is the
# config's ``run_priors``, measured on the `client` tuning requests (whole files and
# search/replace edits back).
RUN_CLASSES = (2, 4, 8, 16, 32, 64, 128, 256, 512)
LINE_FEATURES = ("line", "after")  # the features that name a kind of line


class BreakModel:
    """The chance of a copy breaking at a token, from how long it has held and what
    the source holds there, learned as the text is committed."""

    def __init__(self, priors: Sequence[float] = DEFAULT_CONFIG.run_priors, *, weight: float = 30.0,
                 most: float = 0.95):
        if len(priors) != len(RUN_CLASSES):
            raise ValueError(f"need one prior per run class {RUN_CLASSES}")
        self.priors, self.weight, self.most = tuple(priors), weight, most
        self.runs = [[0, 0] for _ in RUN_CLASSES]  # per class: breaks, tokens copied
        # feature -> [breaks, breaks the runs there predicted, tokens copied]
        self.features: dict[Hashable, list[float]] = {}

    def run_hazard(self, run: int) -> float:
        """The chance that a copy which has held ``run`` tokens breaks at the next."""
        c = _run_class(run)
        breaks, copied = self.runs[c]
        return (breaks + self.weight * self.priors[c]) / (copied + self.weight)

    def hazard(self, run: int, features: Sequence[Hashable]) -> float:
        """The chance that a copy which has held ``run`` tokens breaks at a source
        position with ``features``.

        A line feature (:data:`LINE_FEATURES`: the kind of line a token is on) that broke
        copies where they went through it stands for itself: its rate of breaks, with the
        run's chance as a prior worth one token, so two ``def`` lines that broke make the
        third likely to. A token's own features raise the run's chance by the breaks seen
        at them over the breaks the runs there predicted (each with one break expected
        more, and seen), as a name being renamed does wherever it occurs."""
        run_chance = chance = self.run_hazard(run)
        line_chance = 0.0
        for feature in features:
            counts = self.features.get(feature)
            if counts is None:
                continue
            breaks, expected, seen = counts
            if isinstance(feature, tuple) and feature[0] in LINE_FEATURES:
                line_chance = max(line_chance, (breaks + run_chance) / (seen + 1.0))
            else:
                chance *= max(1.0, (breaks + 1.0) / (expected + 1.0))
        return min(max(chance, line_chance), self.most)

    def observe(self, run: int, features: Sequence[Hashable], broke: bool) -> None:
        """A copied token (the copy had held ``run`` before it; its source position has
        ``features``) held, or broke the copy."""
        expected = self.run_hazard(run)
        counts = self.runs[_run_class(run)]
        counts[0] += broke
        counts[1] += 1
        for feature in features:
            seen = self.features.setdefault(feature, [0.0, 0.0, 0])
            seen[0] += broke
            seen[1] += expected
            seen[2] += 1


def _run_class(run: int) -> int:
    for c in range(len(RUN_CLASSES) - 1, -1, -1):
        if run >= RUN_CLASSES[c]:
            return c
    return 0


class SourceLines:
    """The line structure of a token sequence: the first word of the line each token
    is on, from which ids hold a newline and which are blank (``token_bytes``)."""

    def __init__(self, token_bytes: Callable[[int], bytes] | None = None):
        self.token_bytes = token_bytes
        self._kinds: dict[int, tuple[bool, bool]] = {}  # id -> (has a newline, is blank)
        self.reset()

    def anew(self) -> "SourceLines":
        """An empty one for another sequence (the same vocabulary, what it knows of it)."""
        other = SourceLines(self.token_bytes)
        other._kinds = self._kinds
        return other

    def reset(self) -> None:
        self.heads: list[int] = []  # per token: the first word of its line (-1: none yet)
        self.previous: list[int] = []  # per token: the first word of the line before its line
        self.first: list[bool] = []  # per token: whether it is its line's first word

    def _kind(self, token: int) -> tuple[bool, bool]:
        kind = self._kinds.get(token)
        if kind is None:
            try:
                text = self.token_bytes(token)
            except Exception:  # noqa: BLE001 - an id the vocabulary lacks: no line structure
                text = b""
            kind = self._kinds[token] = (b"\n" in text, not text.strip())
        return kind

    def extend(self, tokens: Sequence[int], start: int) -> None:
        """Classify ``tokens[start:]`` (the ones before are classified already)."""
        if self.token_bytes is None:
            return
        for i in range(start, len(tokens)):
            new_line = i == 0 or self._kind(tokens[i - 1])[0]
            head, previous = (-1, self.heads[i - 1] if i else -1) if new_line else \
                (self.heads[i - 1], self.previous[i - 1])
            blank = self._kind(tokens[i])[1]
            first = head == -1 and not blank
            self.heads.append(tokens[i] if first else head)
            self.previous.append(previous)
            self.first.append(first)

    def features(self, tokens: Sequence[int], position: int) -> list[Hashable]:
        """What the source holds at ``position``, as :class:`BreakModel` features."""
        token = tokens[position]
        features: list[Hashable] = [token, (tokens[position - 1], token) if position else (None, token)]
        if position < len(self.heads):
            features.append(("line", self.heads[position], token))
            if self.first[position]:
                features.append(("after", self.previous[position]))
        return features
