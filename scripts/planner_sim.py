"""Tune auto mode offline: record traces once, then replay the real planner on them.

A real ``edgespec bench`` sweep takes tens of minutes on a 2-core machine, too
slow to compare many policy settings. This script records, per prompt (each turn
of a conversation set, its history the plain replies), the target's plain output
(greedy, or sampled at T > 0) and, teacher-forced along it, what the draft model
would have done: its per-position acceptance probability (greedy: argmax match;
sampled: sum(min(p, q))) and its top probability (for the confidence stop), and
the target's top probability; and the costs of every pass size up to 65 tokens.

``simulate`` then drives the real :class:`~edgespec.planner.AdaptivePlanner`
through the planner interface (plan → review → observe), with the real
:class:`~edgespec.drafters.PromptLookup` (or the real suffix drafter, for
``auto+suffix`` and the fixed suffix rows) and a draft model replayed from the
trace, and charges each round the machine's measured costs (v(n), c and the
catch-up, in plain steps). The planner sees simulated seconds exactly as it
sees real ones, so its cost estimation runs too. It starts from the costs an
earlier run on the machine saved (every size; ``--first-run``: the calibration's
short sizes, the long ones timed where the planner is made, as AutoPlanners does),
``--prior`` from other (e.g. poisoned) costs than the true ones, ``--costs``
simulates another machine's costs (``scripts/costs/epyc-2core.json``), and
``--noise`` jitters each pass's time (a busy machine), which its cost estimation
sees too. A conversation's turns share their drafters and planner, as in a chat.
Beside auto mode it prints fixed settings, llama.cpp's ngram-map-k rule, prompt
lookup that knows where to stop, and the copy ceiling (drafts up to 64 tokens).

It is a model of the engine, not a benchmark: quote ``edgespec bench`` for speed.
Tune on the tuning sets (code, edit, chat) only; the validation sets are not
for tuning.

    python scripts/planner_sim.py record --sets edit,edit-chain,code,chat --out traces.json
    python scripts/planner_sim.py simulate traces.json
    python scripts/planner_sim.py simulate traces.json --set optimism=0.5 --set min_gain=1.02
    python scripts/planner_sim.py simulate traces.json --noise 0.1 --repeats 16
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from dataclasses import fields, replace

import numpy as np

from edgespec.measure.ceiling import ceiling, copy_lengths
from edgespec.planner.calibration import calibrate
from edgespec.core.config import DEFAULT_CONFIG
from edgespec.planner.costs import CostModel
from edgespec.core.draft import DrafterBase
from edgespec.core.planner import DraftingRound, FixedPlanner, draft_round
from edgespec.drafters import Draft, PromptLookup, SuffixDrafter
from edgespec.planner import RoundResult
from edgespec.planner import AdaptivePlanner, PlannerConfig
from edgespec.core.sampling import SamplingParams, logits_to_probs, top_probability

from bench_ngram import MapKRule  # llama.cpp's ngram-map-k rule as an edgespec drafter

MODEL = "model"
TIMED_SIZES = (1, 2, 3, 4, 5, 8, 9, 12, 16, 17, 24, 32, 33, 48, 64, 65)


def record(args) -> None:
    from edgespec.core.cache import CachedModel
    from edgespec.core.engine import Engine
    from edgespec.models.loading import BackendOptions, load_backend
    from edgespec.measure.prompt_sets import load_conversations, turn_messages
    from edgespec.core.prompting import chat_prompt_ids

    options = BackendOptions(n_ctx=args.ctx)
    target = load_backend(args.target, options)
    draft = None if args.draft == "none" else load_backend(args.draft, options)
    # Every pass size auto mode may choose (up to its longest draft, 64), sampled at the
    # powers of two and one past them (repacked kernels multiply rows in groups of 4).
    cost = calibrate(target, [(MODEL, draft)] if draft else [], sizes=TIMED_SIZES, repeats=args.repeats)
    engine = Engine(target, None, num_draft=2)
    vocab = target.vocab.size
    first, last = (int(x) for x in args.prompts.split(":"))

    draft_cache = CachedModel(draft) if draft else None

    def teacher_forced(cache, prompt, out):
        """Row i predicts out[i]; the prompt's prefix stays cached (a conversation's
        next turn extends it)."""
        cache.sync(prompt[:-1], need_logits=False)
        logits = cache.forward([prompt[-1]] + out[:-1])
        cache.rewind(len(prompt) - 1)
        return logits[:, :vocab]

    traces = []
    for temperature in (float(t) for t in args.temps.split(",")):
        params = SamplingParams(temperature=temperature, seed=0)
        for set_name in args.sets.split(","):
            for index, turns in enumerate(load_conversations(set_name)[first:last], start=first):
                messages = []
                for turn, user in enumerate(turns, 1):
                    ids = chat_prompt_ids(target, turn_messages(messages, user))
                    g = engine.generate(ids, params, max_tokens=args.max_tokens, speculative=False)
                    messages.append({"role": "assistant", "content": g.text})
                    out = [int(t) for t in g.token_ids]
                    if g.finish_reason == "stop":
                        out.append(min(target.vocab.eos_token_ids))
                    if draft_cache is None:  # (no draft model: lookup alone is replayed)
                        accept, top, target_top = (np.zeros(len(out)), np.zeros(len(out)),
                                                   np.ones(len(out)))
                    elif temperature == 0:
                        p_logits = teacher_forced(engine.target_cache, ids, out)
                        q_logits = teacher_forced(draft_cache, ids, out)
                        accept = (q_logits.argmax(-1) == np.array(out)).astype(float)
                        top, target_top = top_probability(q_logits), top_probability(p_logits)
                    else:
                        p_logits = teacher_forced(engine.target_cache, ids, out)
                        q_logits = teacher_forced(draft_cache, ids, out)
                        p, q = logits_to_probs(p_logits, params), logits_to_probs(q_logits, params)
                        accept, top, target_top = np.minimum(p, q).sum(-1), q.max(-1), p.max(-1)
                    traces.append({"temp": temperature, "set": set_name if turn == 1 else f"{set_name}@2+",
                                   "index": index, "turn": turn, "prompt": ids,
                                   "out": out, "accept": accept.tolist(), "top": top.tolist(),
                                   "target_top": target_top.tolist(), "draft": draft is not None})
                    print(f"T={temperature:g} {set_name} #{index} turn {turn}: {len(out)} tokens, "
                          f"mean drafter acceptance {accept.mean():.2f}", flush=True)
    with open(args.out, "w") as f:
        json.dump({"costs": cost.as_prior(TIMED_SIZES), "traces": traces}, f)


def time_costs(args) -> None:
    """Time every pass size at each trace's own context (its prompt and the first half of
    its reply cached), into the traces file: what its passes cost there."""
    from edgespec.models.loading import BackendOptions, load_backend

    data = json.load(open(args.traces))
    target = load_backend(args.target, BackendOptions(n_ctx=args.ctx))
    for trace in data["traces"]:
        context = trace["prompt"] + trace["out"][:len(trace["out"]) // 2]
        cost = calibrate(target, [], sizes=TIMED_SIZES, repeats=args.repeats, context=context)
        trace["costs"] = cost.as_prior(TIMED_SIZES)
        print(f"{trace['set']} #{trace['index']} turn {trace.get('turn', 1)}: context {len(context)}, "
              + " ".join(f"v({n})={cost.v(n):.2f}" for n in (2, 4, 8, 16, 32, 64)), flush=True)
    with open(args.traces, "w") as f:
        json.dump(data, f)


class TraceModel(DrafterBase):
    """The draft model of a trace, drafting through the engine's round code
    (:func:`~edgespec.core.planner.draft_round`): it offers the reply's own tokens
    while its recorded top probability clears the stop, and charges the simulated
    clock what its catch-up and its steps cost on the machine; the planner only ever
    sees its name, its kind, what it drafted and those seconds. Whether a drafted
    token is accepted is the trace's business (:func:`replay`)."""

    name = MODEL
    kind = MODEL
    min_confidence = 0.0  # fixed k: no stop; auto: each proposal carries one

    def __init__(self, trace: dict, true: CostModel, clock: "SimClock", noisy):
        self.out, self.top = trace["out"], trace["top"]
        self.true, self.clock, self.noisy = true, clock, noisy
        self.t = self.synced = 0  # the reply's place; the model's cache holds out[:synced]

    def prefill(self, context) -> int:
        behind = self.t - self.synced
        if behind > 2:
            self.clock.charge(self.noisy(self.true.catch_up(MODEL, behind)))
        return behind

    def propose(self, context, num_draft, params, rng, *, min_confidence=None) -> Draft:
        t, drafted = self.t, 0
        p_min = self.min_confidence if min_confidence is None else min_confidence
        while drafted < num_draft and not (p_min and self.top[t + drafted] < p_min):
            drafted += 1
        steps = drafted + (drafted < num_draft)
        self.clock.charge(self.noisy(steps * self.true.c(MODEL)))
        # Token ids stand in for the draft; acceptance is decided from the trace.
        return Draft(list(self.out[t:t + drafted]), confidence=list(self.top[t:t + drafted]) if p_min else None)


class SimClock:
    """Simulated seconds, read by the engine's round code as it reads a real clock:
    they pass only when a simulated drafter charges them."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def charge(self, seconds: float) -> None:
        self.now += seconds


def replay(trace: dict, true: CostModel, *, config: PlannerConfig | None = None,
           prior: dict | None = None, drafter: str | None = None, k: int = 0, rng=None,
           tally: dict | None = None, cheap: str = "lookup", with_model: bool = True,
           noise: float = 0.0, state: dict | None = None, oracle: bool = False) -> float:
    """Speedup over plain decoding of one trace: auto (with ``config``, its costs
    starting from ``prior``, over ``cheap``, prompt lookup or the suffix drafter, and the
    draft model unless not ``with_model``) or a fixed drafter (the draft model, lookup,
    suffix) and k. Each round's drafting is the engine's own
    (:func:`~edgespec.core.planner.draft_round`, with the planner auto mode or a fixed k
    gets there), on a simulated clock.

    ``noise``: each pass takes its true time times a mean-one log-normal factor of
    this spread (a busy machine), which the planner sees as it would on a real clock.
    0.1 is not a measured spread of this CPU's passes: it is enough to reproduce what
    real runs on the code sets show (a draft model dropped after one noisy early round).

    ``state``: a dict kept across the turns of one conversation (its drafters and
    planner carry over, as in ``edgespec chat``); empty at its first turn.
    ``oracle``: a fixed lookup verifies exactly the part of its draft that will be
    accepted (greedy traces): what lookup could reach if it knew where to stop."""
    out, prompt, accept = trace["out"], trace["prompt"], trace["accept"]
    target_top = np.asarray(trace.get("target_top", [1.0] * len(out)))
    greedy, n = trace["temp"] == 0, len(out)
    uses_suffix = drafter == "suffix" or (config is not None and cheap == "suffix")
    state = {} if state is None else state
    clock = np.random.default_rng(rng.integers(1 << 32) if noise and rng is not None else None)

    def noisy(seconds: float) -> float:
        return seconds * math.exp(noise * clock.standard_normal() - noise * noise / 2) if noise else seconds

    sim_clock = SimClock()
    if not state:
        tuning = config or DEFAULT_CONFIG  # (the copying drafters read theirs from it too)
        state["lookup"] = SuffixDrafter(config=tuning) if uses_suffix else MapKRule() \
            if drafter == MapKRule.name else PromptLookup(config=tuning)
        if VOCABULARY and isinstance(state["lookup"], (PromptLookup, SuffixDrafter)):
            state["lookup"].copies.set_vocabulary(VOCABULARY[0].token_bytes)  # line structure
        state["model"] = TraceModel(trace, true, sim_clock, noisy)
        state["planner"] = AdaptivePlanner(
            [state["lookup"], state["model"]] if with_model and trace.get("draft", True)
            else [state["lookup"]],
            CostModel(prior, config), config) if config else None
    lookup, model, planner = state["lookup"], state["model"], state["planner"]
    model.__init__(trace, true, sim_clock, noisy)  # (this turn's reply, costs and clock)
    if planner is None:  # a fixed drafter and k, as the engine plans them
        planner = FixedPlanner(lookup if drafter != MODEL else model, k)
    params = SamplingParams(temperature=trace["temp"])
    t, spent = 0, 0.0

    if config:  # auto mode's planners time the long passes a planner wants where they
        #          make it (AutoPlanners: each between plain steps), once
        sizes = sorted(planner.timing_wanted())
        for size in [m for n in sizes for m in (1, n)] + [1] if sizes else ():
            planner.observe_pass(size, noisy(true.v(size)))
        planner.begin(prompt)

    while t < n:
        limit = min(planner.max_draft, n - t - 1)
        model.t = t
        sim_clock.now = 0.0
        drafting = draft_round(planner, prompt + out[:t], limit, params, rng, sim_clock) \
            if limit > 0 else DraftingRound((), None, Draft([]), 0.0)
        reports, verified, draft = drafting.reports, drafting.verified, drafting.draft
        kind = verified.drafter.name if verified is not None else None
        round_spent = sum((r.catch_up_seconds + r.draft_seconds for r in reports), 0.0)
        if oracle and not config and kind == lookup.name:  # verify just what will be accepted
            held = 0
            while held < len(draft) and out[t + held] == draft.token_ids[held]:
                held += 1
            draft = draft.truncated(held)
            kind = kind if draft.token_ids else None
        accepted = 0
        if kind == lookup.name:
            while accepted < len(draft) and out[t + accepted] == draft.token_ids[accepted]:
                accepted += 1
            if kind == MapKRule.name:
                lookup.accepted(accepted)
        elif kind is not None:
            while accepted < len(draft) and (accept[t + accepted] >= 1 if greedy
                                             else rng.random() < accept[t + accepted]):
                accepted += 1
        verify_s = noisy(true.v(len(draft) + 1))
        round_spent += verify_s
        planner.observe(RoundResult(kind, draft.bucket, len(draft), accepted, len(draft) + 1,
                                    verify_s, target_top[t:t + accepted + 1], tuple(reports),
                                    verified if kind else None))
        spent += round_spent
        if tally is not None:
            key = kind or "plain"
            tally[key] = tally.get(key, 0) + 1
            tally[f"{key} accepted"] = tally.get(f"{key} accepted", 0) + accepted
            tally[f"{key} drafted"] = tally.get(f"{key} drafted", 0) + len(draft)
        if any(r.proposal.drafter is model for r in reports):  # it caught up, and holds
            model.synced = t + (accepted if kind == MODEL else 0)  # its drafts but the last
        t += accepted + 1
    return n / spent


VOCABULARY: list = []  # the target's tokenizer, for the copying drafters' line structure


def simulate(args) -> None:
    data = json.load(open(args.traces))
    if args.vocabulary != "none":
        from edgespec.backends.gguf_tokenizer import GGUFTokenizer
        from edgespec.models.catalog import resolve_model
        VOCABULARY.append(GGUFTokenizer.from_file(resolve_model(args.vocabulary, fetch=False)))
    costs = json.load(open(args.costs)) if args.costs else data["costs"]
    true = CostModel(costs)
    # Each trace's own costs where they were timed at its context (`costs`): a pass
    # attends to everything cached, so long passes cost more after a long prompt.
    own = {id(t): CostModel({**costs, "v": t["costs"]["v"]}) for t in data["traces"]
           if "costs" in t and not args.costs}

    def truth(trace: dict) -> CostModel:
        return own.get(id(trace), true)
    # What a run starts from: the costs an earlier run on this machine saved (every size),
    # or with --first-run the calibration's sizes only; or --prior.
    prior = json.load(open(args.prior)) if args.prior else costs if not args.first_run else {
        **costs, "v": {n: r for n, r in costs["v"].items() if int(n) in DEFAULT_CONFIG.calibration_sizes}}
    names = {f.name for f in fields(PlannerConfig)}
    changes = {}
    for setting in args.set:
        name, value = setting.split("=")
        if name not in names:
            raise SystemExit(f"unknown PlannerConfig field {name!r}: one of {', '.join(sorted(names))}")
        changes[name] = type(getattr(PlannerConfig(), name))(float(value))
    config = replace(PlannerConfig(), **changes)
    settings = {f"{d} k{k}": dict(drafter=d, k=k) for d in (MODEL, "lookup", "suffix") for k in (2, 4)}
    settings.update({f"lookup k{k}": dict(drafter="lookup", k=k) for k in (8, 16, 64)})
    settings["lookup, stops right"] = dict(drafter="lookup", k=64, oracle=True)
    settings["map-k rule"] = dict(drafter=MapKRule.name, k=48)
    settings["auto"] = dict(auto=True, cheap="lookup")
    settings["auto+suffix"] = dict(auto=True, cheap="suffix")
    settings["auto lookup only"] = dict(auto=True, cheap="lookup", with_model=False)
    if args.only:
        settings = {label: settings[label] for label in args.only.split(";")}
    groups = sorted({(t["set"], t["temp"]) for t in data["traces"]})
    # Conversations: a trace's turns in order (a single prompt is a one-turn conversation).
    conversations: dict[tuple, list[dict]] = {}
    for trace in data["traces"]:
        key = (trace["set"].split("@")[0], trace["index"], trace["temp"])
        conversations.setdefault(key, []).append(trace)
    for turns in conversations.values():
        turns.sort(key=lambda t: t.get("turn", 1))
    # The geometric mean over a set's traces: a median of a handful jumps between traces.
    print("speedup over plain, geometric mean of each set's traces")
    print("".ljust(18) + "".join(f"{s}/T={t:g}".rjust(16) for s, t in groups))
    table = {}
    for label, setting in settings.items():
        speeds: dict[tuple, list[float]] = {}
        for turns in conversations.values():
            temp = turns[0]["temp"]
            repeats = 1 if temp == 0 and not args.noise else args.repeats
            per_seed = []
            for seed in range(repeats):
                state: dict = {}
                per_seed.append([replay(trace, truth(trace), rng=np.random.default_rng(seed),
                                        config=config if setting.get("auto") else None, prior=prior,
                                        drafter=setting.get("drafter"), k=setting.get("k", 0),
                                        cheap=setting.get("cheap", "lookup"),
                                        with_model=setting.get("with_model", True), noise=args.noise,
                                        state=state, oracle=setting.get("oracle", False))
                                 for trace in turns])
            for i, trace in enumerate(turns):
                speeds.setdefault((trace["set"], temp), []).append(
                    statistics.mean(run[i] for run in per_seed))
        cells = [statistics.geometric_mean(speeds[group]) for group in groups]
        table[label] = cells
        print(label.ljust(18) + "".join(f"{c:16.3f}" for c in cells))
    longest = max(PlannerConfig().max_draft, config.max_draft)
    ceilings = [statistics.geometric_mean(
        ceiling(copy_lengths(t["prompt"], t["out"], longest), truth(t).v)
        for t in data["traces"] if (t["set"], t["temp"]) == group) for group in groups]
    print(f"copy ceiling{longest}".ljust(18) + "".join(f"{c:16.3f}" for c in ceilings))
    fixed = [label for label in settings if "auto" not in label and "right" not in label]
    best = [max(table[label][i] for label in fixed) for i in range(len(groups))] if fixed else []
    autos = [label for label in ("auto", "auto+suffix", "auto lookup only") if label in table]
    for label in autos if len(best) == len(groups) else ():
        print(f"{label}/best".ljust(18) + "".join(f"{a / b:16.3f}" for a, b in zip(table[label], best)))
    for label in autos:
        print(f"{label}/ceiling".ljust(18) + "".join(f"{a / c:16.3f}" for a, c in zip(table[label], ceilings)))
    if args.verbose:
        for trace in data["traces"]:
            tally: dict = {}
            speed = replay(trace, truth(trace), rng=np.random.default_rng(0), config=config, prior=prior,
                           tally=tally, noise=args.noise)
            bound = ceiling(copy_lengths(trace["prompt"], trace["out"], longest), truth(trace).v)
            print(f"{trace['set']}/T={trace['temp']:g} #{trace['index']} turn {trace.get('turn', 1)}: "
                  f"{len(trace['out'])} tokens, auto {speed:.3f}, ceiling {bound:.3f} "
                  f"({speed / bound:.2f})  {tally}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="record traces (runs the models)")
    rec.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    rec.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct",
                     help="the draft model to record ('none': prompt lookup alone)")
    rec.add_argument("--sets", default="code,edit,chat")
    rec.add_argument("--prompts", default="0:3", help="FIRST:LAST prompt indices of each set")
    rec.add_argument("--temps", default="0,0.7")
    rec.add_argument("--max-tokens", type=int, default=128)
    rec.add_argument("--ctx", type=int, default=4096)
    rec.add_argument("--out", default="traces.json")
    rec.add_argument("--repeats", type=int, default=3, help="timed passes of each size")
    timing = sub.add_parser("costs", help="time the pass sizes at each trace's context (runs the target)")
    timing.add_argument("traces")
    timing.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    timing.add_argument("--ctx", type=int, default=8192)
    timing.add_argument("--repeats", type=int, default=2, help="timed passes of each size")
    sim = sub.add_parser("simulate", help="replay auto mode and fixed settings on traces")
    sim.add_argument("traces")
    sim.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                     help="override a PlannerConfig field, e.g. optimism=0.5")
    sim.add_argument("--costs", help="a cost file (ratios) of the machine to simulate, instead of "
                     "the one the traces were recorded on (at T = 0 acceptance does not depend on it)")
    sim.add_argument("--prior", help="a cost file (ratios) to start the planner from, "
                     "instead of the true costs (e.g. a poisoned one)")
    sim.add_argument("--verbose", action="store_true", help="auto's rounds on each trace")
    sim.add_argument("--only", default="", help="settings to run, separated by ; (default: all)")
    sim.add_argument("--vocabulary", default="qwen2.5-coder-1.5b-instruct",
                     help="the model whose tokenizer the traces use ('none': no line structure)")
    sim.add_argument("--first-run", action="store_true",
                     help="start from the calibration's pass sizes only (a first run on a machine)")
    sim.add_argument("--repeats", type=int, default=2, help="seeds per trace at T > 0 (or with --noise)")
    sim.add_argument("--noise", type=float, default=0.0,
                     help="spread of each pass's time (log-normal; 0.1 reproduces what real runs show)")
    args = parser.parse_args()
    {"record": record, "simulate": simulate, "costs": time_costs}[args.command](args)


if __name__ == "__main__":
    main()
