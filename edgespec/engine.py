"""The engine: one round loop for speculative and plain decoding.

A round: the drafter proposes up to k tokens for the committed context; the
target evaluates the last committed token plus the k drafts in one forward
pass (k+1 rows of logits); the verifier keeps an accepted prefix plus one
token; the caches drop whatever was not committed. Plain decoding is the same
loop with no drafts, so benchmarks compare like with like.

Cache invariant between rounds: the target's cache holds the committed
context minus its last token (the "pending" token, evaluated together with the
next drafts). The prefill stops one token short for the same reason. The
engine restores it in ``finally`` blocks, so an abandoned or cancelled
generation leaves both caches consistent.

Which drafter drafts and how far is the planner's business
(:mod:`edgespec.planning`): a fixed drafter and k, or auto mode
(:class:`~edgespec.planning.AdaptivePlanner`). The engine times each proposal
and each target pass and tells the planner what happened; it never asks what
kind of drafter it holds. A plain step is a round with an empty draft.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Callable, Iterator, Sequence

import numpy as np

from .acceptance import runnable_drafts
from .backends.base import Backend
from .cache import CachedModel, common_prefix_length
from .calibration import PassTimer
from .coupling import Coupling
from .drafters.base import Draft, Drafter
from .errors import EdgespecError
from .generation import Chunk, Generation, Run, collect, sampling_from, stream_text
from .planning import FixedPlanner, Planner, RoundResult
from .planning.base import DraftingRound, draft_round
from .planning.auto import auto_planner
from .prompting import chat_prompt_ids, prompt_ids
from .sampling import SamplingParams, Scratch, make_rng
from .shaping import Shaping, token_logprobs
from .stats import GenerationStats

# Prompt tokens evaluated between two looks at a cancel (llama.cpp's default batch).
PREFILL_CHUNK = 512


class Engine:
    """Generates text from a target model, optionally with a drafter.

    ``num_draft`` is k, or ``"auto"`` for auto mode (prompt lookup and the
    drafter, chosen round by round, starting from this model pair's cached
    costs, or a short calibration the first time); ``planner`` replaces either with a
    planner of your own. One generation runs at a time per engine;
    :meth:`cancel` stops the running one from any thread, and :meth:`close`
    (from any thread) cancels it, waits for it and frees the models.
    """

    def __init__(self, target: Backend, drafter: Drafter | None = None, *,
                 num_draft: int | str = 4, planner: Planner | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        self.target = target
        self._clock = clock  # what times passes (tests give toy models a simulated one)
        self.target_cache = CachedModel(target)
        self._scratch = Scratch()  # the target's rows on the host, reused every round
        self._timer = PassTimer(self.target_cache, clock, self._scratch)  # for the planner's long passes
        self._busy = threading.Lock()  # held by the one generation running
        # Held while engine code touches the models, never across a yield: close()
        # takes it to wait for a pass in flight, so it never frees a model in use.
        self._models = threading.Lock()
        self._closed = False
        self._runs: weakref.WeakSet[Run] = weakref.WeakSet()  # made and not finished
        self._runs_lock = threading.Lock()
        self.planner: Planner | None = None
        self._auto: tuple[Planner | None, Drafter | None] = (None, None)  # the last auto planner
        self._built: list[Planner] = []  # auto planners built here (closing one keeps its costs)
        self.configure(drafter, num_draft, planner)

    # -- public API -----------------------------------------------------------------

    def configure(self, drafter: Drafter | None, num_draft: int | str,
                  planner: Planner | None = None) -> None:
        """Set the drafter and k (an int, or ``"auto"``), or a planner of your own.

        In auto mode the engine keeps what it learned across generations; it
        starts afresh only when the drafter or the mode changes.
        """
        self._check_open()
        if drafter is not None:
            drafter.attach(self.target)
        if num_draft == "auto":
            if planner is None:  # the same drafter again: keep what auto mode learned
                kept, kept_for = self._auto
                if kept is not None and kept_for is drafter:
                    planner = kept
                else:  # from this pair's cached costs (a short calibration the first time,
                    #      through the caches generation uses), kept again when closed
                    planner = auto_planner(self.target_cache, drafter)
                    self._built.append(planner)
            self._auto = (planner, drafter)
        self.planner = planner or FixedPlanner(drafter, num_draft)  # (which checks num_draft)
        self.drafter = drafter
        self.num_draft = num_draft

    def set_drafter(self, drafter: Drafter | None) -> None:
        """Use another drafter from the next generation on (checked like the first)."""
        self.configure(drafter, self.num_draft)

    @property
    def n_ctx(self) -> int:
        """The context a generation may fill: the smallest of the target's and every
        draft model's (llama.cpp rounds a context up to 256 tokens, MLX does not, so
        a mixed pair may differ; a speculative run ends where a plain one would)."""
        sizes = [getattr(d, "n_ctx", None) for d in self.active_drafters()]
        return min([self.target.n_ctx] + [n for n in sizes if n])

    def active_drafters(self) -> list[Drafter]:
        """Every drafter a generation may consult."""
        return list(self.planner.drafters)

    @property
    def drafter_name(self) -> str:
        """How stats name the drafting in use."""
        return self.planner.name

    def tokenize(self, prompt: str | Sequence[int]) -> list[int]:
        """Token ids of a prompt given as text (special tokens parsed) or as ids."""
        self._check_open()
        return prompt_ids(self.target, prompt)

    def stream(self, prompt: str | Sequence[int], params: SamplingParams | None = None, *,
               max_tokens: int = 256, stop: Sequence[str] = (), speculative: bool = True,
               rng: np.random.Generator | Coupling | None = None,
               cancel: threading.Event | None = None, shaping: Shaping | None = None,
               logprobs: int | None = None) -> Iterator[Chunk]:
        """Yield :class:`Chunk` objects as tokens are committed.

        Bad arguments raise here, before any work. The last chunk has
        ``finish_reason`` and ``stats``. Closing the generator early, or
        :meth:`cancel` at any time after this call returns (even before the
        first chunk is read), leaves the engine ready for the next call.
        ``cancel``: an event of your own that ends this generation alone
        when set (a server's per-request stop). ``shaping``: logit bias, penalties
        or a grammar (:class:`~edgespec.shaping.Shaping`), applied to the target's
        distribution at every position, speculative or not. ``logprobs``: report
        each token's log-probability and this many alternatives (``Chunk.logprobs``).
        """
        params = params or SamplingParams()
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise ValueError(f"invalid max_tokens={max_tokens!r}: must be an integer >= 1")
        prompt_ids = self.tokenize(prompt)
        if not prompt_ids:
            raise EdgespecError("the prompt is empty: give at least one token of text")
        n_ctx = self.n_ctx
        if len(prompt_ids) >= n_ctx:
            raise EdgespecError(
                f"the prompt has {len(prompt_ids)} tokens but the context holds {n_ctx}: "
                f"shorten the prompt or raise --ctx")
        if logprobs is not None and (not isinstance(logprobs, int) or isinstance(logprobs, bool)
                                     or not 0 <= logprobs <= 20):
            raise ValueError(f"invalid top_logprobs={logprobs!r}: must be an integer from 0 to 20")
        shaping = shaping if shaping is not None and shaping.active else None
        if shaping is not None:
            shaping.start(self.target, len(prompt_ids))
        speculative = speculative and bool(self.active_drafters())
        stats = GenerationStats(drafter=self.drafter_name if speculative else "none",
                                prompt_tokens=len(prompt_ids))
        run = Run(list(prompt_ids), params, rng or make_rng(params), max_tokens, speculative, stats,
                   n_ctx, cancelled=cancel or threading.Event(), shaping=shaping, logprobs=logprobs)
        with self._runs_lock:
            self._runs.add(run)
        return self._generation(run, stop)

    def _generation(self, run: Run, stop: Sequence[str]) -> Iterator[Chunk]:
        if not self._busy.acquire(blocking=False):
            raise EdgespecError("this engine is already generating: wait for the running "
                                "generation to finish or cancel it first")
        try:
            yield from stream_text(run, self._decode(run), self.target.token_bytes, stop, self._models,
                                   lambda: self._closed)
        finally:
            with self._runs_lock:
                self._runs.discard(run)
            self._busy.release()

    def generate(self, prompt: str | Sequence[int], params: SamplingParams | None = None,
                 **options) -> Generation:
        """Run :meth:`stream` to the end and collect the result.

        Sampling fields may be given directly (``temperature=0.7``) instead of ``params``.
        """
        params, options = sampling_from(params, options)
        return collect(self.stream(prompt, params, **options))

    def chat(self, messages: list[dict], *, stream: bool = True,
             params: SamplingParams | None = None, **options) -> Iterator[Chunk] | Generation:
        """Reply to chat ``messages`` (dicts with ``role`` and ``content``).

        Renders them with the target's chat template. With ``stream=True`` it
        yields :class:`Chunk` objects, the last one with ``finish_reason`` and
        ``stats``; otherwise it returns the :class:`Generation`. Sampling
        fields may be given directly (``temperature=0.7, top_p=0.9``). ``tools``:
        tool definitions for the chat template (OpenAI's shape).
        """
        self._check_open()
        params, options = sampling_from(params, options)
        prompt = chat_prompt_ids(self.target, messages, tools=options.pop("tools", None))
        chunks = self.stream(prompt, params, **options)
        return chunks if stream else collect(chunks)

    def close(self) -> None:
        """Cancel the running generation (from any thread), wait for the pass in
        flight, and free the models. Every later call raises; closing twice is fine.

        In auto mode the costs measured while running become the next run's prior
        (also those of an auto planner switched away from): each planner keeps its own.
        """
        if self._closed:
            return
        self._closed = True  # from here on nothing new starts
        self.cancel()
        with self._models:  # a pass in flight ends first; then no run touches a model again
            for planner in {id(p): p for p in [*self._built, self.planner]}.values():
                planner.close()
            self.target.close()
            for drafter in self.active_drafters():
                drafter.close()

    def cancel(self) -> None:
        """End every generation made so far (running or not yet started) after the
        token being committed; generations made after this call are not affected."""
        with self._runs_lock:
            runs = list(self._runs)
        for run in runs:
            run.cancelled.set()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise EdgespecError("this engine is closed: load the model again to generate")

    # -- token loop -----------------------------------------------------------------

    def _decode(self, run: Run) -> Iterator[tuple[int, bool]]:
        """Yield ``(token_id, from_draft)`` for each committed token."""
        stats, ctx = run.stats, run.context
        eos = self.target.vocab.eos_token_ids
        start = self._clock()
        decode_start = None
        try:
            # Prefill all but the last prompt token: it is evaluated with the first
            # round's drafts, so even the first generated token is speculative.
            if not self._prefill(run):
                return
            if run.speculative:
                stats.draft_prompt_eval_tokens = sum(d.prefill(ctx) for d in self.active_drafters())
                self.planner.begin(ctx)
            decode_start = self._clock()
            stats.prefill_time_s = decode_start - start
            while not run.cancelled.is_set():
                pending = self._round(run)
                for i, (token, from_draft) in enumerate(pending):
                    if token in eos:
                        finish = "stop"  # the end token is not output, nor counted
                    else:
                        stats.generated_tokens += 1
                        ctx.append(token)
                        yield token, from_draft
                        finish = "length" if (stats.generated_tokens >= run.max_tokens
                                              or len(ctx) >= run.n_ctx) else \
                            "cancelled" if run.cancelled.is_set() else None
                    if finish:
                        run.finish_reason = finish
                        # Accepted drafts after the finish were never committed: uncount them.
                        stats.unaccept(sum(f for _, f in pending), sum(f for _, f in pending[i + 1:]))
                        return
            run.finish_reason = "cancelled"
        finally:
            if decode_start is not None:
                stats.decode_time_s = self._clock() - decode_start
            if not self._closed:  # (after close() the models are gone, and so is the state)
                self.target_cache.rewind(common_prefix_length(self.target_cache.tokens, ctx))
                if run.speculative:
                    for drafter in self.active_drafters():
                        drafter.rewind(ctx)

    def _prefill(self, run: Run) -> bool:
        """Evaluate the prompt but its last token into the target's cache, in
        chunks between which a cancel is seen; False if cancelled.

        Where the planner wants pass sizes timed (:meth:`Planner.timing_wanted`), the
        prompt's last tokens go in timed passes (:class:`~edgespec.calibration.PassTimer`),
        evaluated again if the cache held them already: the planner asks once per
        machine and model, and what it timed is kept for the next run."""
        prompt = run.context[:-1]
        # (Not with exact kernels: the timed passes would leave the prompt's last tokens in
        # the cache as verify passes compute them, not as plain decoding's prefill does.)
        timed = run.speculative and not getattr(self.target, "bit_exact", False)
        sizes = PassTimer.sizes(self.planner.timing_wanted(), len(prompt)) if timed else []
        end = len(prompt) - sum(sizes)
        done = min(common_prefix_length(self.target_cache.tokens, prompt), end)
        self.target_cache.rewind(done)
        while done < end:
            if run.cancelled.is_set():
                run.finish_reason = "cancelled"
                return False
            done = min(done + PREFILL_CHUNK, end)
            _, evaluated = self.target_cache.sync(prompt[:done], need_logits=False)
            run.stats.prompt_eval_tokens += evaluated
        for n in sizes:
            if run.cancelled.is_set():
                run.finish_reason = "cancelled"
                return False
            self.planner.observe_pass(n, self._timer.time(prompt[done:done + n]))
            done += n
            run.stats.prompt_eval_tokens += n
        run.stats.prompt_eval_tokens += 1  # the last prompt token, with the first drafts
        return True

    def _round(self, run: Run) -> list[tuple[int, bool]]:
        """One target pass over the pending token and a draft (if any); returns
        the committed tokens, each with whether it was an accepted draft."""
        stats, ctx = run.stats, run.context
        self.target_cache.sync(ctx[:-1], need_logits=False)  # drops last round's rejected drafts
        # Draft no more than every model's context holds or the caller will use (the
        # target's own token after the drafts makes up the last one): the one check.
        limit = min(run.n_ctx - len(ctx), run.max_tokens - stats.generated_tokens - 1)
        drafting = draft_round(self.planner, ctx, limit, run.params, run.rng, self._clock, run.shaping) \
            if run.speculative and limit > 0 else DraftingRound((), None, Draft([]), 0.0)
        reports, verified, draft = drafting.reports, drafting.verified, drafting.draft
        stats.draft_time_s += drafting.seconds
        stats.probes += bool(verified and verified.probe)
        drafter = verified.drafter if verified else None
        run.draft_kind = drafter.kind if drafter else None  # (what this round's tokens come from)

        start = self._clock()
        # A drafter with extra vocabulary rows may propose an id the target lacks:
        # the target runs up to it, and the verifier rejects it for certain.
        runnable = runnable_drafts(draft.token_ids, self.target.vocab.size)
        if run.shaping is not None:  # nor one a request's grammar refuses (its p is 0)
            runnable = run.shaping.admissible(ctx, draft.token_ids[:runnable])
            if runnable and draft.token_ids[runnable - 1] in self.target.vocab.eos_token_ids:
                draft = draft.truncated(runnable)  # (nothing after an end is ever committed)
        draft = draft.truncated(runnable + 1)  # nothing after such an id can be accepted
        logits = self.target_cache.verify_pass([ctx[-1], *draft.token_ids[:runnable]])  # [n, V]
        if run.shaping is not None or run.logprobs is not None:  # (on the host)
            logits = np.asarray(logits) if run.shaping is None else \
                run.shaping.apply(logits, ctx, draft.token_ids[:runnable])
        verdict, top_probs = self.target.verify(logits, draft.token_ids, draft.probs, run.params, run.rng,
                                                draft_scales=draft.scales, position=len(ctx),
                                                confidence=self.planner.wants_confidence,
                                                scratch=self._scratch)
        if run.logprobs is not None:
            run.token_logprobs += token_logprobs(logits, verdict.token_ids, run.logprobs)
        seconds = self._clock() - start

        self.planner.observe(RoundResult(
            drafter.name if drafter else None, draft.bucket, len(draft), verdict.num_accepted,
            len(logits), seconds, top_probs, reports, verified))
        if drafter is None:
            stats.plain_steps += 1
            stats.plain_time_s += seconds
        else:
            stats.record_round(len(draft), verdict.num_accepted, drafter.name)
            stats.verify_time_s += seconds
            drafter.accepted(verdict.num_accepted)
        return [(token, i < verdict.num_accepted) for i, token in enumerate(verdict.token_ids)]
