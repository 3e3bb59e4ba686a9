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

Which drafter drafts and how far is the planner's business: a fixed drafter and
k, or auto mode (:class:`~edgespec.planner.AdaptivePlanner`). The engine is handed
its planners ready made (:class:`~edgespec.core.planner.Planners`: one for each
drafter and k a generation asks for) and builds none itself. It times each
proposal and each target pass and tells the planner what happened; it never asks
what kind of drafter it holds. A plain step is a round with an empty draft.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Callable, Iterator, Sequence

import numpy as np

from ..errors import EdgespecError
from .acceptance import runnable_drafts
from .backend import Backend
from .cache import CachedModel, common_prefix_length
from .coupling import Coupling
from .draft import NO_DRAFTER, Draft, Drafter
from .generation import Chunk, Committed, Generation, PromptProgress, Run, collect, sampling_from, stream_text
from .planner import (DraftingRound, FixedPlanners, Planner, Planners, RoundResult, check_num_draft,
                      draft_round)
from .prompt_cache import PromptCache
from .prompting import chat_prompt_ids, prompt_ids
from .sampling import SamplingParams, Scratch, make_rng
from .shaping import Shaping, token_logprobs
from .stats import GenerationStats


_DEFAULT = object()  # (a generation's drafter: the engine's own)


class Engine:
    """Generates text from a target model, optionally with a drafter.

    ``drafter`` and ``num_draft`` (k, or ``"auto"``) are what a generation uses unless
    it says otherwise; ``planners`` makes the planner for each (auto mode's come from
    :class:`edgespec.planner.AutoPlanners`, which :func:`edgespec.load` hands every
    engine it makes; without it only a fixed k), and ``planner`` replaces the one for the
    engine's own drafter and k with one of your own. One generation runs at a time per
    engine; :meth:`cancel` stops the running one from any thread, and :meth:`close`
    (from any thread) cancels it, waits for it and frees the models.
    """

    def __init__(self, target: Backend | CachedModel, drafter: Drafter | None = None, *,
                 num_draft: int | str = 4, planner: Planner | None = None,
                 planners: Planners | None = None, prompt_cache: PromptCache | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        # The cache generations run through (the planners' timing too, so it stays true).
        self.target_cache = target if isinstance(target, CachedModel) else CachedModel(target)
        # Where the conversations the models' caches drop are kept (the target's, every
        # draft model's): a prompt that repeats one restores it instead of evaluating it.
        self.prompt_cache = prompt_cache
        if prompt_cache is not None:
            self.target_cache.prompt_cache = prompt_cache
        self.target = self.target_cache.backend
        self._clock = clock  # what times passes (tests give toy models a simulated one)
        self._scratch = Scratch()  # the target's rows on the host, reused every round
        self._busy = threading.Lock()  # held by the one generation running
        # Held while engine code touches the models, never across a yield: close()
        # takes it to wait for a pass in flight, so it never frees a model in use.
        self._models = threading.Lock()
        self._closed = False
        self._runs: weakref.WeakSet[Run] = weakref.WeakSet()  # made and not finished
        self._runs_lock = threading.Lock()
        self.planners = planners or FixedPlanners()
        self._own: list[Planner] = []  # planners given to this engine (closed with it)
        self._attached: dict[int, Drafter] = {}  # drafters checked against the target
        self.configure(drafter, num_draft, planner)

    # -- public API -----------------------------------------------------------------

    def configure(self, drafter: Drafter | None, num_draft: int | str,
                  planner: Planner | None = None) -> None:
        """Set the drafter and k (an int, or ``"auto"``) generations use unless they say
        otherwise, or a planner of your own; in auto mode the planners keep what they
        learned across generations, one per drafter. (A server never calls this: a
        request's drafter and k are arguments of its generation.)
        """
        self._check_open()
        if planner is None:
            planner = self.planner_for(drafter, num_draft)
        else:
            self._attach(drafter)
            self._own.append(planner)
        self.planner, self.drafter, self.num_draft = planner, drafter, num_draft

    def set_drafter(self, drafter: Drafter | None) -> None:
        """Use another drafter from the next generation on (checked like the first)."""
        self.configure(drafter, self.num_draft)

    def planner_for(self, drafter: Drafter | None, num_draft: int | str) -> Planner:
        """The planner of a generation with ``drafter`` and ``num_draft`` (checked: a
        drafter whose vocabulary the target cannot take is refused here)."""
        self._check_open()
        check_num_draft(num_draft)
        if self._busy.locked():  # (a new planner may time passes through the target's cache)
            raise EdgespecError("this engine is already generating: wait for the running "
                                "generation to finish or cancel it first")
        self._attach(drafter)
        with self._models:
            return self.planners.planner(drafter, num_draft, target=self.target_cache, clock=self._clock)

    def _attach(self, drafter: Drafter | None) -> None:
        """Check ``drafter`` against the target once (a draft model's vocabulary)."""
        if drafter is not None and self._attached.get(id(drafter)) is not drafter:
            drafter.attach(self.target)
            if isinstance(drafter.cache, CachedModel) and drafter.cache.prompt_cache is None:
                drafter.cache.prompt_cache = self.prompt_cache
            self._attached[id(drafter)] = drafter

    @property
    def n_ctx(self) -> int:
        """The context a generation may fill: the smallest of the target's and every
        draft model's (llama.cpp rounds a context up to 256 tokens, MLX does not, so
        a mixed pair may differ; a speculative run ends where a plain one would)."""
        return self._n_ctx(self.planner)

    def _n_ctx(self, planner: Planner) -> int:
        return min([self.target.n_ctx] + [n for d in planner.drafters if (n := d.n_ctx)])

    def active_drafters(self) -> list[Drafter]:
        """Every drafter a generation with the engine's own drafter and k may consult."""
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
               logprobs: int | None = None, drafter: Drafter | None = _DEFAULT,
               num_draft: int | str | None = None, cache_prompt: bool = True,
               progress: Callable[[PromptProgress], None] | None = None) -> Iterator[Chunk]:
        """Yield :class:`Chunk` objects as tokens are committed.

        Bad arguments raise here, before any work. The last chunk has
        ``finish_reason`` and ``stats``. Closing the generator early, or
        :meth:`cancel` at any time after this call returns (even before the
        first chunk is read), leaves the engine ready for the next call.
        ``cancel``: an event of your own that ends this generation alone
        when set (a server's per-request stop). ``shaping``: logit bias, penalties
        or a grammar (:class:`~edgespec.core.shaping.Shaping`), applied to the target's
        distribution at every position, speculative or not. ``logprobs``: report
        each token's log-probability and this many alternatives (``Chunk.logprobs``).
        ``drafter`` and ``num_draft``: this generation's, instead of the engine's own
        (the engine's settings stay as they are). ``cache_prompt=False``: reuse nothing cached.
        ``progress``: called with a :class:`PromptProgress` while the prompt is processed
        (once with what was cached, after each pass, and at the end), in the thread that
        reads the stream.
        """
        params = params or SamplingParams()
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise ValueError(f"invalid max_tokens={max_tokens!r}: must be an integer >= 1")
        if drafter is _DEFAULT and num_draft is None:
            planner = self.planner
        else:
            planner = self.planner_for(self.drafter if drafter is _DEFAULT else drafter,
                                       self.num_draft if num_draft is None else num_draft)
        prompt_ids = self.tokenize(prompt)
        if not prompt_ids:
            raise EdgespecError("the prompt is empty: give at least one token of text")
        n_ctx = self._n_ctx(planner)
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
        speculative = speculative and bool(planner.drafters)
        stats = GenerationStats(drafter=planner.name if speculative else NO_DRAFTER,
                                prompt_tokens=len(prompt_ids))
        run = Run(list(prompt_ids), params, rng or make_rng(params), max_tokens, speculative, stats,
                  n_ctx, planner, cancelled=cancel or threading.Event(), shaping=shaping,
                  logprobs=logprobs, cache_prompt=bool(cache_prompt), progress=progress)
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
        (also those of an auto planner switched away from): the planners keep their own.
        With a prompt cache that has a folder, the conversation in the models' caches and
        every state held in RAM are written there first (a restart restores them).
        """
        if self._closed:
            return
        self._closed = True  # from here on nothing new starts
        self.cancel()
        with self._models:  # a pass in flight ends first; then no run touches a model again
            if self.prompt_cache is not None:  # (never raises: the models are freed anyway)
                self.prompt_cache.flush([self.target_cache] + [d.cache for d in self.active_drafters()
                                                               if isinstance(d.cache, CachedModel)])
            for planner in {id(p): p for p in self._own}.values():
                planner.close()
            self.planners.close()
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

    def _decode(self, run: Run) -> Iterator[Committed]:
        """Yield each committed token, with what it came from."""
        stats, ctx, planner = run.stats, run.context, run.planner
        eos = self.target.vocab.eos_token_ids
        start = self._clock()
        decode_start = None
        try:
            # Prefill all but the last prompt token: it is evaluated with the first
            # round's drafts, so even the first generated token is speculative.
            if not self._prefill(run):
                return
            if run.speculative:
                for drafter in planner.drafters:  # a draft model's saved state of this prompt
                    if isinstance(drafter.cache, CachedModel):
                        drafter.cache.reuse(ctx)
                stats.draft_prompt_eval_tokens = sum(d.prefill(ctx) for d in planner.drafters)
                planner.begin(ctx)
            decode_start = self._clock()
            stats.prefill_time_s = decode_start - start
            while not run.cancelled.is_set():
                pending = self._round(run)
                for i, committed in enumerate(pending):
                    if committed.token in eos:
                        finish = "stop"  # the end token is not output, nor counted
                    else:
                        stats.generated_tokens += 1
                        ctx.append(committed.token)
                        yield committed
                        finish = "length" if (stats.generated_tokens >= run.max_tokens
                                              or len(ctx) >= run.n_ctx) else \
                            "cancelled" if run.cancelled.is_set() else None
                    if finish:
                        run.finish_reason = finish
                        # Accepted drafts after the finish were never committed: uncount them.
                        stats.unaccept(sum(c.from_draft for c in pending),
                                       sum(c.from_draft for c in pending[i + 1:]))
                        return
            run.finish_reason = "cancelled"
        finally:
            if decode_start is not None:
                stats.decode_time_s = self._clock() - decode_start
            if not self._closed:  # (after close() the models are gone, and so is the state)
                self.target_cache.rewind(common_prefix_length(self.target_cache.tokens, ctx))
                if run.speculative:
                    for drafter in planner.drafters:
                        drafter.rewind(ctx)
                if self.prompt_cache is not None:  # (the drafters' memory counts in its budget)
                    self.prompt_cache.settle(planner.drafters)

    def _prefill(self, run: Run) -> bool:
        """Evaluate the prompt but its last token into the target's cache (its last
        token goes in with the first round's drafts); False if cancelled meanwhile."""
        done = self.target_cache.prefill(run.context[:-1], cached=run.cache_prompt, cancel=run.cancelled,
                                         progress=run.progress, clock=self._clock)
        if done is None:
            run.finish_reason = "cancelled"
            return False
        run.stats.prompt_eval_tokens, run.stats.prompt_restored_tokens = done[0] + 1, done[1]
        return True

    def _round(self, run: Run) -> list[Committed]:
        """One target pass over the pending token and a draft (if any); returns
        the committed tokens, each with what it came from."""
        stats, ctx, planner = run.stats, run.context, run.planner
        self.target_cache.sync(ctx[:-1], need_logits=False)  # drops last round's rejected drafts
        # Draft no more than every model's context holds or the caller will use (the
        # target's own token after the drafts makes up the last one): the one check.
        limit = min(run.n_ctx - len(ctx), run.max_tokens - stats.generated_tokens - 1)
        drafting = draft_round(planner, ctx, limit, run.params, run.rng, self._clock, run.shaping) \
            if run.speculative and limit > 0 else DraftingRound((), None, Draft([]), 0.0)
        reports, verified, draft = drafting.reports, drafting.verified, drafting.draft
        stats.draft_time_s += drafting.seconds
        stats.probes += bool(verified and verified.probe)
        drafter = verified.drafter if verified else None

        start = self._clock()
        # A drafter with extra vocabulary rows may propose an id the target lacks:
        # the target runs up to it, and the verifier rejects it for certain.
        runnable = runnable_drafts(draft.token_ids, self.target.vocab.size)
        if run.shaping is not None:  # nor one a request's grammar refuses (its p is 0)
            runnable = run.shaping.admissible(ctx, draft.token_ids[:runnable])
            if runnable and draft.token_ids[runnable - 1] in self.target.vocab.eos_token_ids:
                draft = draft.truncated(runnable)  # (nothing after an end is ever committed)
        draft = draft.truncated(runnable + 1)  # nothing after such an id can be accepted
        # [n, V]; on the host where the request's shaping or logprobs read them
        logits = self.target_cache.verify_pass([ctx[-1], *draft.token_ids[:runnable]],
                                               shaping=run.shaping, logprobs=run.logprobs)
        if run.shaping is not None:
            logits = run.shaping.apply(logits, ctx, draft.token_ids[:runnable])
        verdict, top_probs = self.target.verify(logits, draft.token_ids, draft.probs, run.params, run.rng,
                                                draft_scales=draft.scales, position=len(ctx),
                                                confidence=planner.wants_confidence,
                                                scratch=self._scratch)
        logprobs = token_logprobs(logits, verdict.token_ids, run.logprobs) \
            if run.logprobs is not None else [None] * len(verdict.token_ids)
        seconds = self._clock() - start

        planner.observe(RoundResult(
            drafter.name if drafter else None, draft.bucket, len(draft), verdict.num_accepted,
            len(logits), seconds, top_probs, reports, verified))
        if drafter is None:
            stats.plain_steps += 1
            stats.plain_time_s += seconds
        else:
            stats.record_round(len(draft), verdict.num_accepted, drafter.name)
            stats.verify_time_s += seconds
            drafter.accepted(verdict.num_accepted)
        kind = drafter.kind if drafter else None
        return [Committed(token, i < verdict.num_accepted, kind if i < verdict.num_accepted else None,
                          logprobs[i]) for i, token in enumerate(verdict.token_ids)]
