"""Counters of one generation: what was drafted, accepted, and where time went."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .draft import NO_DRAFTER


@dataclass
class GenerationStats:
    """Statistics of one generation (names follow vLLM's spec-decode counters).

    A *round* drafts k tokens and verifies them in one target pass; a *plain
    step* is a one-token target pass (no draft was worth proposing, or
    speculation is off). ``mean_accepted_length`` counts the correction or
    bonus token: 1 + accepted / rounds, the tokens committed per target pass.
    """

    drafter: str = NO_DRAFTER
    prompt_tokens: int = 0
    prompt_eval_tokens: int = 0  # target tokens evaluated to prefill (cache reuse makes it small)
    draft_prompt_eval_tokens: int = 0
    prompt_restored_tokens: int = 0  # of the cached ones: restored from the prompt cache in RAM
    generated_tokens: int = 0
    rounds: int = 0
    plain_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    rounds_per_drafter: dict[str, int] = field(default_factory=dict)
    drafted_per_drafter: dict[str, int] = field(default_factory=dict)
    accepted_per_drafter: dict[str, int] = field(default_factory=dict)
    probes: int = 0  # auto mode: rounds tried while the estimates said they would lose
    prefill_time_s: float = 0.0
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    plain_time_s: float = 0.0
    decode_time_s: float = 0.0  # wall time after prefill, until the last token

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens / drafted tokens (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens committed per verifying target pass: 1 + accepted / rounds."""
        return 1.0 + self.accepted / self.rounds if self.rounds else 1.0

    @property
    def acceptance_per_position(self) -> list[float]:
        """For each draft position i: accepted / drafted at position i."""
        return [a / d if d else 0.0
                for a, d in zip(self.accepted_per_position, self.drafted_per_position)]

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens per second of decoding (prefill excluded, as llama.cpp's eval rate)."""
        return self.generated_tokens / self.decode_time_s if self.decode_time_s > 0 else 0.0

    @property
    def cached_prompt_tokens(self) -> int:
        """Prompt tokens reused from the KV cache: those the prefill did not evaluate
        (llama-server's ``cache_n``)."""
        return max(self.prompt_tokens - self.prompt_eval_tokens, 0)

    @property
    def prefill_tokens_per_second(self) -> float:
        """Prompt tokens evaluated on the target per second of prefill."""
        return self.prompt_eval_tokens / self.prefill_time_s if self.prefill_time_s > 0 else 0.0

    def record_round(self, num_drafted: int, num_accepted: int, drafter: str = "") -> None:
        """Count one verified round (by ``drafter``, for the per-drafter tally)."""
        self.rounds += 1
        self._last_drafter = drafter  # (whose accepted drafts unaccept() takes back)
        if drafter:
            for tally, n in ((self.rounds_per_drafter, 1), (self.drafted_per_drafter, num_drafted),
                             (self.accepted_per_drafter, num_accepted)):
                tally[drafter] = tally.get(drafter, 0) + n
        self.drafted += num_drafted
        self.accepted += num_accepted
        for counts, n in ((self.drafted_per_position, num_drafted),
                          (self.accepted_per_position, num_accepted)):
            if len(counts) < n:
                counts.extend([0] * (n - len(counts)))
            for i in range(n):
                counts[i] += 1

    def unaccept(self, round_accepted: int, unused: int) -> None:
        """Take back the last ``unused`` of a round's ``round_accepted`` accepted drafts:
        the generation finished (end token, length, cancel) before they were committed."""
        if unused <= 0:
            return
        self.accepted -= unused
        drafter = getattr(self, "_last_drafter", "")
        if drafter:
            self.accepted_per_drafter[drafter] -= unused
        for position in range(round_accepted - unused, round_accepted):
            self.accepted_per_position[position] -= 1

    def merge(self, other: "GenerationStats") -> None:
        """Add another generation's counters to these (session totals)."""
        for name, value in asdict(other).items():
            if isinstance(value, list):
                mine = getattr(self, name)
                mine.extend([0] * (len(value) - len(mine)))
                for i, v in enumerate(value):
                    mine[i] += v
            elif isinstance(value, dict):
                mine = getattr(self, name)
                for key, count in value.items():
                    mine[key] = mine.get(key, 0) + count
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                setattr(self, name, getattr(self, name) + value)
        if other.drafter != NO_DRAFTER:
            self.drafter = other.drafter

    def to_dict(self) -> dict:
        """All counters and derived rates, by name (for ``--json``)."""
        data = asdict(self)
        for name in ("acceptance_rate", "mean_accepted_length", "acceptance_per_position",
                     "tokens_per_second", "prefill_tokens_per_second"):
            data[name] = getattr(self, name)
        return data
