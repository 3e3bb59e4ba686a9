"""What ``edgespec serve`` counts: ``GET /metrics`` and a log line per request.

``/metrics`` is Prometheus's text exposition, written by ``prometheus_client``
from a registry of the app's own (so that several apps in one process, as in the
tests, do not collide). The names follow llama-server's (``llamacpp:...``), so
dashboards made for it work; edgespec's own (``edgespec:...``) count the drafting:
tokens drafted and accepted, in all and per drafter, and the queue's waits and
refusals. Values are read from one :class:`GenerationStats` per finished
generation (cancelled ones too: their work was done), so they add up exactly to
the ``timings`` of the responses.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..core.prompt_cache import PromptCache
from ..planner import calibration
from ..core.stats import GenerationStats

# The text format llama-server's /metrics declares (what generate_latest writes).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
log = logging.getLogger("edgespec.serve.server")

# (name, help) of the totals kept, as llama-server names them or in edgespec's words.
TOTALS = {
    "prompt_tokens": ("llamacpp:prompt_tokens", "Number of prompt tokens processed."),
    "prompt_seconds": ("llamacpp:prompt_seconds", "Prompt process time"),
    "tokens_predicted": ("llamacpp:tokens_predicted", "Number of generation tokens processed."),
    "predicted_seconds": ("llamacpp:tokens_predicted_seconds", "Predict process time"),
    "cached": ("edgespec:prompt_tokens_cached", "Prompt tokens reused from the KV cache."),
    "drafted": ("edgespec:drafted_tokens", "Draft tokens proposed to the target."),
    "accepted": ("edgespec:accepted_tokens", "Draft tokens the target accepted."),
    "queued": ("edgespec:requests_queued", "Requests that waited for their turn."),
    "rejected": ("edgespec:requests_rejected", "Requests refused with 503: the queue was full."),
}
PER_DRAFTER = {
    "rounds": ("edgespec:drafter_rounds", "Verified rounds, by drafter."),
    "drafted": ("edgespec:drafter_drafted_tokens", "Draft tokens proposed, by drafter."),
    "accepted": ("edgespec:drafter_accepted_tokens", "Draft tokens accepted, by drafter."),
}


class Metrics:
    """The server's totals, and their Prometheus exposition.

    ``load``: what is happening now, as (generating, waiting) requests, read at
    each scrape.
    """

    def __init__(self, load: Callable[[], tuple[int, int]],
                 prompt_cache: Callable[[], PromptCache | None] = lambda: None):
        self._load = load
        self._prompt_cache = prompt_cache
        self._lock = threading.Lock()  # generations finish in the worker thread
        self.totals = dict.fromkeys(TOTALS, 0.0)
        self.per_drafter: dict[str, dict[str, int]] = {name: {} for name in PER_DRAFTER}
        self.rounds = 0
        self.drafted_per_position: list[int] = []
        self.accepted_per_position: list[int] = []
        self.finished: dict[str, int] = {}  # generations, by finish reason
        self.refused: dict[str, int] = {}  # requests refused before any route, by reason
        self.n_tokens_max = 0
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(self)

    def count(self, what: str) -> None:
        """One more request that ``what`` ("queued" or "rejected")."""
        with self._lock:
            self.totals[what] += 1

    def refusal(self, reason: str) -> None:
        """One more request refused by :mod:`~edgespec.serve.guard` (``host_not_allowed``...)."""
        with self._lock:
            self.refused[reason] = self.refused.get(reason, 0) + 1

    def generation(self, stats: GenerationStats, reason: str) -> None:
        """Count a finished generation."""
        with self._lock:
            t = self.totals
            t["prompt_tokens"] += stats.prompt_eval_tokens
            t["prompt_seconds"] += stats.prefill_time_s
            t["tokens_predicted"] += stats.generated_tokens
            t["predicted_seconds"] += stats.decode_time_s
            t["cached"] += stats.cached_prompt_tokens
            t["drafted"] += stats.drafted
            t["accepted"] += stats.accepted
            for name, tally in (("rounds", stats.rounds_per_drafter),
                                ("drafted", stats.drafted_per_drafter),
                                ("accepted", stats.accepted_per_drafter)):
                for drafter, n in tally.items():
                    self.per_drafter[name][drafter] = self.per_drafter[name].get(drafter, 0) + n
            self.rounds += stats.rounds
            for tally, counts in ((self.drafted_per_position, stats.drafted_per_position),
                                  (self.accepted_per_position, stats.accepted_per_position)):
                tally.extend([0] * (len(counts) - len(tally)))
                for i, n in enumerate(counts):
                    tally[i] += n
            self.finished[reason] = self.finished.get(reason, 0) + 1
            self.n_tokens_max = max(self.n_tokens_max, stats.prompt_tokens + stats.generated_tokens)

    def collect(self):
        """The metric families (called by the registry at each scrape)."""
        with self._lock:
            totals, per_drafter = dict(self.totals), {k: dict(v) for k, v in self.per_drafter.items()}
            finished, n_tokens_max = dict(self.finished), self.n_tokens_max
            refused = dict(self.refused)
            rounds, accepted_at = self.rounds, list(self.accepted_per_position)
        for key, (name, text) in TOTALS.items():
            yield CounterMetricFamily(name, text, value=totals[key])
        yield from self._speculation(rounds, totals, accepted_at)
        yield from self._saved_prompts()
        for key, (name, text) in PER_DRAFTER.items():
            family = CounterMetricFamily(name, text, labels=["drafter"])
            for drafter, n in sorted(per_drafter[key].items()):
                family.add_metric([drafter], n)
            yield family
        family = CounterMetricFamily("edgespec:generations", "Finished generations, by finish "
                                     "reason (cancelled: the client went away).", labels=["reason"])
        for reason, n in sorted(finished.items()):
            family.add_metric([reason], n)
        yield family
        yield CounterMetricFamily("edgespec:calibrations", "Calibrations of a model pair's costs "
                                  "run by this process (at load, or while idle).",
                                  value=calibration.calibrations)
        family = CounterMetricFamily("edgespec:requests_refused", "Requests refused before any "
                                     "route ran (another site's page, a foreign Host, not JSON, "
                                     "too large), by reason.", labels=["reason"])
        for reason, n in sorted(refused.items()):
            family.add_metric([reason], n)
        yield family
        generating, waiting = self._load()
        for name, text, value in (
                ("prompt_tokens_seconds", "Average prompt throughput in tokens/s.",
                 _rate(totals["prompt_tokens"], totals["prompt_seconds"])),
                ("predicted_tokens_seconds", "Average generation throughput in tokens/s.",
                 _rate(totals["tokens_predicted"], totals["predicted_seconds"])),
                ("requests_processing", "Number of requests processing.", generating),
                ("requests_deferred", "Number of requests deferred.", waiting),
                ("n_tokens_max", "Largest observed n_tokens.", n_tokens_max)):
            yield GaugeMetricFamily(f"llamacpp:{name}", text, value=value)

    @staticmethod
    def _speculation(rounds: int, totals: dict, accepted_at: list[int]):
        """Speculation's counters under the names vLLM and llama-server share."""
        yield CounterMetricFamily("edgespec:spec_decode_num_drafts", "Draft rounds verified.", value=rounds)
        yield CounterMetricFamily("edgespec:spec_decode_num_draft_tokens", "Draft tokens proposed.",
                                  value=totals["drafted"])
        yield CounterMetricFamily("edgespec:spec_decode_num_accepted_tokens", "Draft tokens accepted.",
                                  value=totals["accepted"])
        family = CounterMetricFamily("edgespec:spec_decode_num_accepted_tokens_per_pos",
                                     "Draft tokens accepted, by position in the draft.",
                                     labels=["position"])
        for position, n in enumerate(accepted_at):
            family.add_metric([str(position)], n)
        yield family

    def _saved_prompts(self):
        """The prompt cache's counters (none when the server has no prompt cache)."""
        cache = self._prompt_cache()
        if cache is None:
            return
        stats = cache.stats()
        for name, text, value in (
                ("hits", "Prompts that restored a saved KV state.", stats.hits),
                ("misses", "Prompts that found no saved state sharing enough of them.", stats.misses),
                ("evictions", "Saved states dropped for room.", stats.evictions),
                ("restored_tokens", "Prompt tokens restored instead of evaluated.",
                 stats.restored_tokens),
                ("disk_hits", "Of the hits, states restored from the folder (--cache-dir).", stats.disk_hits),
                ("disk_writes", "States written to the folder.", stats.disk_writes),
                ("disk_refused", "Files of the folder that failed a check (removed; evaluated instead).",
                 stats.disk_refused)):
            yield CounterMetricFamily(f"edgespec:prompt_cache_{name}", text, value=value)
        yield GaugeMetricFamily("edgespec:prompt_cache_disk_bytes", "Bytes the folder's states take.",
                                value=stats.disk_bytes)
        yield GaugeMetricFamily("edgespec:prompt_cache_bytes", "Bytes of saved KV states held.",
                                value=stats.bytes)
        yield GaugeMetricFamily("edgespec:prompt_cache_states", "Saved KV states held.",
                                value=stats.entries)
        family = GaugeMetricFamily("edgespec:memory_bytes", "Host memory conversations leave "
                                   "behind, by part, all within --cache-ram: saved states, the "
                                   "drafters' copy indexes and counts, a draft model's logits.",
                                   labels=["part"])
        for part, n in sorted(cache.memory().items()):
            family.add_metric([part], n)
        yield family
        yield GaugeMetricFamily("edgespec:memory_budget_bytes", "The budget (--cache-ram).",
                                value=cache.budget)

    def exposition(self) -> bytes:
        """The text ``GET /metrics`` answers."""
        return generate_latest(self.registry)


def _rate(tokens: float, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else 0.0


def log_generation(kind: str, reason: str, stats: GenerationStats) -> None:
    """One line per finished generation, as llama-server prints its timings."""
    rate = f"{stats.acceptance_rate:.0%}" if stats.drafted else "-"
    log.info("%s: prompt %d tokens (%d cached: %d in the KV cache, %d restored from RAM; "
             "%d evaluated at %.1f tok/s), decode %d tokens "
             "at %.1f tok/s, drafted %d, accepted %d (%s), drafter %s, finish %s",
             kind, stats.prompt_tokens, stats.cached_prompt_tokens,
             stats.cached_prompt_tokens - stats.prompt_restored_tokens, stats.prompt_restored_tokens,
             stats.prompt_eval_tokens,
             stats.prefill_tokens_per_second, stats.generated_tokens, stats.tokens_per_second,
             stats.drafted, stats.accepted, rate, stats.drafter, reason)
