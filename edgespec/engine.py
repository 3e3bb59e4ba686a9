"""The engine: one round loop for speculative and plain decoding.

A round: the drafter proposes up to k tokens for the committed context; the
target evaluates the last committed token plus the k drafts in one forward
pass (k+1 rows of logits); the verifier keeps an accepted prefix plus one
token; the caches drop whatever was not committed. Plain decoding is the same
loop with no drafts, so benchmarks compare like with like.

Cache invariant between rounds: the target's cache holds the committed
context minus its last token (the "pending" token, evaluated together with the
next drafts). The prefill stops one token short for the same reason. The engine restores it in ``finally`` blocks, so an abandoned or
cancelled generation leaves both caches consistent.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from .backends.base import Backend
from .cache import CachedModel, common_prefix_length
from .detokenize import IncrementalDetokenizer, StopMatcher
from .adaptive import LOOKUP_MAX_NGRAM, MAX_DRAFT, AdaptivePolicy, lookup_key
from .compat import check_compatible
from .drafters.base import Draft, Drafter
from .drafters.draft_model import DraftModel
from .drafters.prompt_lookup import PromptLookup
from .errors import EdgespecError
from .sampling import SamplingParams, logits_to_probs, make_rng, sample_from, top_probability
from .stats import GenerationStats
from .verify import greedy_verify, rejection_sample


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


@dataclass
class _Run:
    """The state of one generation, shared by the token loop and its caller."""

    context: list[int]
    params: SamplingParams
    rng: np.random.Generator
    max_tokens: int
    speculative: bool
    stats: GenerationStats
    finish_reason: str | None = None


class Engine:
    """Generates text from a target model, optionally with a drafter.

    One generation runs at a time per engine; :meth:`cancel` stops the
    running one from any thread.
    """

    def __init__(self, target: Backend, drafter: Drafter | None = None, *,
                 num_draft: int | str = 4, policy: AdaptivePolicy | None = None):
        self.target = target
        self._lookup: PromptLookup | None = None
        self.policy: AdaptivePolicy | None = None
        self.configure(drafter, num_draft, policy)
        self.target_cache = CachedModel(target)
        self._busy = threading.Lock()
        self._cancel = threading.Event()

    # -- public API -----------------------------------------------------------------

    def configure(self, drafter: Drafter | None, num_draft: int | str,
                  policy: AdaptivePolicy | None = None) -> None:
        """Set the drafter and k (an int, or ``"auto"`` for the adaptive policy)."""
        if num_draft != "auto" and not (isinstance(num_draft, int) and num_draft >= 1):
            raise ValueError(f"invalid num_draft={num_draft!r}: must be an integer >= 1 or 'auto'")
        self.num_draft = num_draft
        # Auto mode: the policy picks prompt lookup, the draft model or plain decoding
        # each round; prompt lookup is always on offer, since it costs nothing to ask.
        self.policy = (policy or self.policy or AdaptivePolicy()) if num_draft == "auto" else None
        self.set_drafter(drafter)

    def set_drafter(self, drafter: Drafter | None) -> None:
        """Use another drafter from the next generation on (checked like the first)."""
        if isinstance(drafter, DraftModel):
            check_compatible(self.target, drafter.backend)
        self.drafter = drafter
        if self.policy is not None:
            # Longer n-grams than a fixed lookup uses: they tell a copy in progress
            # (an 8-token match) from a coincidence (a 2-token one).
            self._lookup = drafter if isinstance(drafter, PromptLookup) else \
                (self._lookup or PromptLookup(max_ngram=LOOKUP_MAX_NGRAM))

    @property
    def draft_model(self) -> DraftModel | None:
        """The draft model in use, if the drafter is one."""
        return self.drafter if isinstance(self.drafter, DraftModel) else None

    def active_drafters(self) -> list[Drafter]:
        """Every drafter a generation may consult."""
        if self.policy is None:
            return [self.drafter] if self.drafter is not None else []
        return [self._lookup] + ([self.draft_model] if self.draft_model else [])

    @property
    def drafter_name(self) -> str:
        """How stats name the drafting in use."""
        if self.policy is not None:
            return "auto(" + "+".join(d.name for d in self.active_drafters()) + ")"
        return self.drafter.name if self.drafter is not None else "none"

    def tokenize(self, prompt: str | Sequence[int]) -> list[int]:
        """Token ids of a prompt given as text (special tokens parsed) or as ids."""
        if isinstance(prompt, str):
            from .prompting import raw_prompt_ids
            return raw_prompt_ids(self.target, prompt)
        return [int(t) for t in prompt]

    def stream(self, prompt: str | Sequence[int], params: SamplingParams | None = None, *,
               max_tokens: int = 256, stop: Sequence[str] = (), speculative: bool = True,
               rng: np.random.Generator | None = None) -> Iterator[Chunk]:
        """Yield :class:`Chunk` objects as tokens are committed.

        The last chunk has ``finish_reason`` and ``stats``. Closing the
        generator early (or :meth:`cancel`) leaves the engine ready for the
        next call.
        """
        params = params or SamplingParams()
        if max_tokens < 1:
            raise ValueError(f"invalid max_tokens={max_tokens!r}: must be an integer >= 1")
        prompt_ids = self.tokenize(prompt)
        if not prompt_ids:
            raise EdgespecError("the prompt is empty: give at least one token of text")
        if len(prompt_ids) >= self.target.n_ctx:
            raise EdgespecError(
                f"the prompt has {len(prompt_ids)} tokens but the context holds {self.target.n_ctx}: "
                f"shorten the prompt or raise --ctx")
        if not self._busy.acquire(blocking=False):
            raise EdgespecError("this engine is already generating: wait for the running "
                                "generation to finish or cancel it first")
        try:
            self._cancel.clear()
            speculative = speculative and bool(self.active_drafters())
            stats = GenerationStats(
                drafter=self.drafter_name if speculative else "none",
                prompt_tokens=len(prompt_ids))
            if speculative and self.policy is not None:
                self._ensure_calibrated()
            run = _Run(list(prompt_ids), params, rng or make_rng(params), max_tokens,
                       speculative, stats)
            yield from self._stream_text(run, stop)
        finally:
            self._busy.release()

    def generate(self, prompt: str | Sequence[int], params: SamplingParams | None = None,
                 **options) -> Generation:
        """Run :meth:`stream` to the end and collect the result.

        Sampling fields may be given directly (``temperature=0.7``) instead of ``params``.
        """
        params, options = _sampling_from(params, options)
        return _collect(self.stream(prompt, params, **options))

    def chat(self, messages: list[dict], *, stream: bool = True,
             params: SamplingParams | None = None, **options) -> Iterator[Chunk] | Generation:
        """Reply to chat ``messages`` (dicts with ``role`` and ``content``).

        Renders them with the target's chat template. With ``stream=True`` it
        yields :class:`Chunk` objects, the last one with ``finish_reason`` and
        ``stats``; otherwise it returns the :class:`Generation`. Sampling
        fields may be given directly (``temperature=0.7, top_p=0.9``).
        """
        from .prompting import chat_prompt_ids
        params, options = _sampling_from(params, options)
        chunks = self.stream(chat_prompt_ids(self.target, messages), params, **options)
        return chunks if stream else _collect(chunks)

    def close(self) -> None:
        """Free the models (target and draft model); the engine is unusable afterwards.

        In auto mode the costs measured while running replace the cached calibration.
        """
        if self.policy is not None and 1 in self.policy.cost.target_s:
            from .adaptive import calibration_path, save_calibration
            draft = self.draft_model.backend if self.draft_model else None
            save_calibration(self.policy.cost, calibration_path(self.target, draft))
        self.target.close()
        if self.draft_model is not None:
            self.draft_model.backend.close()

    def cancel(self) -> None:
        """Ask the running generation to stop after the token being committed."""
        self._cancel.set()

    # -- text layer -----------------------------------------------------------------

    def _stream_text(self, run: _Run, stop: Sequence[str]) -> Iterator[Chunk]:
        detok = IncrementalDetokenizer(self.target.token_bytes)
        matcher = StopMatcher(stop)
        tokens = self._decode(run)
        stopped = False
        try:
            for token, from_draft in tokens:
                text, stopped = matcher.feed(detok.add(token))
                yield Chunk(text, [token], from_draft)
                if stopped:
                    run.finish_reason = "stop"
                    break
        finally:
            tokens.close()  # runs the token loop's cleanup (cache rewind, timings)
        tail = "" if stopped else matcher.flush(detok.flush())
        yield Chunk(tail, [], False, run.finish_reason, run.stats)

    # -- token loop -----------------------------------------------------------------

    def _decode(self, run: _Run) -> Iterator[tuple[int, bool]]:
        """Yield ``(token_id, from_draft)`` for each committed token."""
        stats, ctx = run.stats, run.context
        eos = self.target.vocab.eos_token_ids
        start = time.perf_counter()
        decode_start = None
        try:
            # Prefill all but the last prompt token: it is evaluated with the first
            # round's drafts, so even the first generated token is speculative.
            _, evaluated = self.target_cache.sync(ctx[:-1], need_logits=False)
            stats.prompt_eval_tokens = evaluated + 1
            if run.speculative:
                stats.draft_prompt_eval_tokens = sum(d.prefill(ctx) for d in self.active_drafters())
            decode_start = time.perf_counter()
            stats.prefill_time_s = decode_start - start
            while True:
                pending = self._round(run)
                for i, (token, from_draft) in enumerate(pending):
                    if token in eos:
                        finish = "stop"  # the end token is not output, nor counted
                    else:
                        stats.generated_tokens += 1
                        ctx.append(token)
                        yield token, from_draft
                        finish = "length" if (stats.generated_tokens >= run.max_tokens
                                              or len(ctx) >= self.target.n_ctx) else \
                            "cancelled" if self._cancel.is_set() else None
                    if finish:
                        run.finish_reason = finish
                        # Accepted drafts after the finish were never committed: uncount them.
                        stats.unaccept(sum(f for _, f in pending), sum(f for _, f in pending[i + 1:]))
                        return
        finally:
            if decode_start is not None:
                stats.decode_time_s = time.perf_counter() - decode_start
            self.target_cache.rewind(common_prefix_length(self.target_cache.tokens, ctx))
            if run.speculative:
                for drafter in self.active_drafters():
                    drafter.rewind(ctx)

    def _ensure_calibrated(self) -> None:
        """Measure (or load the cached) costs of this pair before the first auto round."""
        if 1 in self.policy.cost.target_s:
            return
        from .adaptive import load_or_calibrate
        drafts = []
        self.target_cache.rewind(0)
        if self.draft_model is not None:
            self.draft_model.cache.rewind(0)
            drafts.append((self.draft_model.name, self.draft_model.backend))
        self.policy.cost = load_or_calibrate(self.target, drafts)

    def _round(self, run: _Run) -> list[tuple[int, bool]]:
        """One target pass: verify a draft if there is one, else a plain step."""
        stats, ctx = run.stats, run.context
        self.target_cache.sync(ctx[:-1], need_logits=False)  # drops last round's rejected drafts
        # Draft no more than the context holds or the caller will use (the target's
        # own token after the drafts makes up the last one).
        limit = min(MAX_DRAFT if self.policy else self.num_draft, self.target.n_ctx - len(ctx),
                    run.max_tokens - stats.generated_tokens - 1)
        key, drafter, draft, stopped = None, None, Draft([]), False
        if run.speculative and limit > 0:
            key, drafter, draft, stopped = self._propose(run, limit)
        draft_ids = draft.token_ids[:limit]
        # A drafter with a few extra vocabulary rows may propose an id the target
        # does not have: p is 0 there, so that draft is rejected for certain. The
        # draft ends before it, and the position is resolved as a rejection below
        # (greedy needs no such care: the target's argmax is always in its vocabulary).
        out_of_vocab = False
        for i, token in enumerate(draft_ids):
            if token >= self.target.vocab.size:
                draft_ids, out_of_vocab = draft_ids[:i], True
                break

        t0 = time.perf_counter()
        if not draft_ids:
            logits = self.target_cache.forward([ctx[-1]])[-1]  # [V]
            self._observe_target(1, time.perf_counter() - t0)
            probs = None if run.params.greedy else logits_to_probs(logits, run.params)
            if out_of_vocab and draft.probs is not None and probs is not None:
                # The first draft was out of vocabulary: a rejection at position 0.
                token = self._resample_rejected(probs, draft.probs[0], run)
            else:
                token = int(np.argmax(logits)) if probs is None else sample_from(probs, run.rng)
            self._observe_confidence(logits[None], None if probs is None else probs[None], run)
            stats.plain_steps += 1
            stats.plain_time_s += time.perf_counter() - t0
            return [(token, False)]

        logits = self.target_cache.forward([ctx[-1], *draft_ids])  # [k+1, V]
        self._observe_target(len(draft_ids) + 1, time.perf_counter() - t0)
        target_probs = None
        if run.params.greedy:
            new = greedy_verify(np.argmax(logits, axis=-1), draft_ids)
        else:
            target_probs = logits_to_probs(logits, run.params)  # [k+1, V]
            draft_probs = None if draft.probs is None else \
                _fit_vocab(draft.probs[:len(draft_ids)], target_probs.shape[-1])  # [k, V]
            new = rejection_sample(target_probs, draft_ids, draft_probs, run.rng)
            if out_of_vocab and len(new) == len(draft_ids) + 1 and draft.probs is not None:
                # Not a bonus token: the rejection at the out-of-vocabulary draft.
                new[-1] = self._resample_rejected(target_probs[len(draft_ids)],
                                                  draft.probs[len(draft_ids)], run)
        num_accepted = len(new) - 1
        committed = slice(0, len(new))  # the target's rows for the tokens this round commits
        self._observe_confidence(logits[committed],
                                 None if target_probs is None else target_probs[committed], run)
        stats.record_round(len(draft_ids), num_accepted, drafter.name)
        drafter.accepted(num_accepted)
        if self.policy is not None:
            self.policy.observe_round(key, len(draft_ids), num_accepted, stopped)
        stats.verify_time_s += time.perf_counter() - t0
        return [(t, True) for t in new[:-1]] + [(new[-1], False)]

    def _propose(self, run: _Run, limit: int) -> tuple[str | None, Drafter | None, Draft, bool]:
        """The draft for this round: from the fixed drafter, or as the policy plans.

        Returns the policy's key for the drafter, the drafter, the draft, and
        whether a draft model stopped short of the planned k (low confidence).
        """
        stats, policy = run.stats, self.policy
        if policy is None:
            return self.drafter.name, self.drafter, self._timed_propose(self.drafter, run, limit), False
        if self._lookup is not None:
            draft = self._timed_propose(self._lookup, run, limit)
            if draft.token_ids:
                plan = policy.plan_lookup(draft.match_length, len(draft.token_ids), limit)
                if plan.num_draft:
                    stats.probes += plan.probe
                    return (lookup_key(draft.match_length), self._lookup,
                            Draft(draft.token_ids[:plan.num_draft], None, draft.match_length), False)
        model = self.draft_model
        if model is not None:
            behind = len(run.context) - common_prefix_length(model.cache.tokens, run.context)
            plan = policy.plan_model(model.name, limit, behind)
            if plan.num_draft:
                draft = self._timed_propose(model, run, plan.num_draft)
                policy.cost.observe_drafter(model.name, model.last_steps, model.last_step_seconds)
                policy.cost.observe_sync(model.name, model.last_catch_up, model.last_catch_up_seconds)
                stopped = len(draft.token_ids) < plan.num_draft
                if not draft.token_ids:  # not confident enough to draft anything
                    policy.observe_round(model.name, 0, 0, stopped=True)
                    return None, None, draft, False
                stats.probes += plan.probe
                return model.name, model, draft, stopped
        return None, None, Draft([]), False

    @staticmethod
    def _timed_propose(drafter: Drafter, run: _Run, num_draft: int) -> Draft:
        """``drafter.propose``, its time added to the run's drafting time."""
        start = time.perf_counter()
        draft = drafter.propose(run.context, num_draft, run.params, run.rng)
        run.stats.draft_time_s += time.perf_counter() - start
        return draft

    def _observe_confidence(self, logits: np.ndarray, probs: np.ndarray | None, run: _Run) -> None:
        """Tell the policy whether the target was confident about each committed token
        (rows of its logits, or of its probabilities when sampling), by the draft
        model's stop threshold (without one, every token counts: it always drafts)."""
        model = self.draft_model
        if self.policy is None or model is None:
            return
        top = top_probability(logits) if probs is None else probs.max(-1)
        self.policy.observe_confidence(top >= model.min_confidence)

    def _observe_target(self, n: int, seconds: float) -> None:
        if self.policy is not None:
            self.policy.cost.observe_target(n, seconds)

    @staticmethod
    def _resample_rejected(target_probs: np.ndarray, draft_probs: np.ndarray, run: _Run) -> int:
        """The replacement after a certain rejection: norm(max(0, p - q)) over the target's ids."""
        q = _fit_vocab(draft_probs[None], target_probs.shape[-1])[0]
        residual = np.maximum(target_probs - q, 0.0)
        return sample_from(residual if residual.sum() > 0 else target_probs, run.rng)


def _fit_vocab(draft_probs: np.ndarray, vocab_size: int) -> np.ndarray:
    """q over the target's vocabulary: ids the target lacks have p = 0, so
    dropping their columns leaves max(p - q, 0) unchanged; missing ids get q = 0."""
    width = draft_probs.shape[-1]
    if width == vocab_size:
        return draft_probs
    if width > vocab_size:
        return draft_probs[:, :vocab_size]
    return np.pad(draft_probs, ((0, 0), (0, vocab_size - width)))


_SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "seed")


def _sampling_from(params: SamplingParams | None, options: dict) -> tuple[SamplingParams, dict]:
    """Split sampling fields out of keyword options and merge them into ``params``."""
    fields = {k: options.pop(k) for k in _SAMPLING_FIELDS if k in options}
    params = params or SamplingParams()
    return (params.with_(**fields) if fields else params), options


def _collect(chunks: Iterator[Chunk]) -> Generation:
    texts, token_ids, from_draft = [], [], []
    for chunk in chunks:
        texts.append(chunk.text)
        token_ids.extend(chunk.token_ids)
        from_draft.extend([chunk.from_draft] * len(chunk.token_ids))
        if chunk.finish_reason is not None:
            return Generation("".join(texts), token_ids, from_draft, chunk.finish_reason, chunk.stats)
    raise AssertionError("stream ended without a final chunk")
