"""Tune auto mode offline: record traces once, then replay the policy on them.

A real ``edgespec bench`` sweep takes 10-20 minutes on a 2-core machine, too
slow to compare many policy settings. This script records, per prompt, the
target's plain output (greedy, or sampled at T > 0) and, teacher-forced along
it, what the drafters would have done: the draft model's per-position
acceptance probability (greedy: argmax match; sampled: sum(min(p, q))) and
its top probability (for the confidence stop), and the target's top probability
(auto mode's prior for that stop). ``simulate`` then replays the
real :class:`~edgespec.adaptive.AdaptivePolicy` and prompt lookup on those
traces, charging each round with the machine's measured costs (v(n), c and
the drafter's catch-up), and prints speedups for auto mode and fixed settings.

It is a model of the engine, not a benchmark: quote ``edgespec bench`` for
speed. It reproduces the bench's ranking (e.g. lookup wins on edits, the
0.5B drafter on code, plain on chat) and helped pick the constants in
``edgespec/adaptive.py``.

    python scripts/policy_sim.py record --out traces.json          # ~4 min
    python scripts/policy_sim.py simulate traces.json
    python scripts/policy_sim.py simulate traces.json --set OPTIMISM=0.5
"""

from __future__ import annotations

import argparse
import json
import statistics

import numpy as np

import edgespec.adaptive as adaptive
from edgespec.drafters import PromptLookup
from edgespec.sampling import SamplingParams, logits_to_probs, top_probability

MODEL = "model"


def record(args) -> None:
    from edgespec.engine import Engine
    from edgespec.loading import BackendOptions, load_backend
    from edgespec.prompt_sets import load_prompt_set
    from edgespec.prompting import chat_prompt_ids

    options = BackendOptions()
    target = load_backend(args.target, options)
    draft = load_backend(args.draft, options)
    cost = adaptive.calibrate(target, [(MODEL, draft)])
    engine = Engine(target, None, num_draft=2)
    vocab = target.vocab.size
    first, last = (int(x) for x in args.prompts.split(":"))

    def teacher_forced(backend, prompt, out):
        backend.rewind(0)
        backend.forward(prompt[:-1], last_only=True)
        logits = backend.forward([prompt[-1]] + out[:-1])  # row i predicts out[i]
        backend.rewind(0)
        return logits[:, :vocab]

    traces = []
    for temperature in (float(t) for t in args.temps.split(",")):
        params = SamplingParams(temperature=temperature, seed=0)
        for set_name in args.sets.split(","):
            for index, prompt in enumerate(load_prompt_set(set_name)[first:last], start=first):
                ids = chat_prompt_ids(target, [{"role": "user", "content": prompt}])
                g = engine.generate(ids, params, max_tokens=args.max_tokens, speculative=False)
                out = [int(t) for t in g.token_ids]
                if g.finish_reason == "stop":
                    out.append(min(target.vocab.eos_token_ids))
                engine.target_cache.rewind(0)
                p_logits = teacher_forced(target, ids, out)
                q_logits = teacher_forced(draft, ids, out)
                if temperature == 0:
                    accept = (q_logits.argmax(-1) == np.array(out)).astype(float)
                    top, target_top = top_probability(q_logits), top_probability(p_logits)
                else:
                    p, q = logits_to_probs(p_logits, params), logits_to_probs(q_logits, params)
                    accept, top, target_top = np.minimum(p, q).sum(-1), q.max(-1), p.max(-1)
                traces.append({"temp": temperature, "set": set_name, "index": index, "prompt": ids,
                               "out": out, "accept": accept.tolist(), "top": top.tolist(),
                               "target_top": target_top.tolist()})
                print(f"T={temperature:g} {set_name} #{index}: {len(out)} tokens, "
                      f"mean drafter acceptance {accept.mean():.2f}", flush=True)
    with open(args.out, "w") as f:
        json.dump({"costs": cost.to_dict(), "traces": traces}, f)


def replay(trace: dict, cost: adaptive.CostModel, *, policy=None, drafter=None, k=0,
           p_min=0.0, rng=None) -> float:
    """Speedup over plain decoding of one trace: auto (``policy``) or a fixed drafter and k."""
    out, prompt, accept, top = trace["out"], trace["prompt"], trace["accept"], trace["top"]
    target_top = trace.get("target_top", [1.0] * len(out))
    greedy, n = trace["temp"] == 0, len(out)
    lookup = PromptLookup(max_ngram=adaptive.LOOKUP_MAX_NGRAM if policy else 4)
    params = SamplingParams(temperature=trace["temp"])
    t, spent, synced = 0, 0.0, 0  # synced: the draft model's cache holds out[:synced]
    while t < n:
        limit = min(adaptive.MAX_DRAFT if policy else k, n - t - 1)
        kind, planned, draft, key = None, 0, [], None
        if limit > 0 and (policy or drafter == "lookup"):
            proposal = lookup.propose(prompt + out[:t], limit, params, rng)
            if proposal.token_ids:
                planned = len(proposal.token_ids)
                if policy:
                    key = adaptive.lookup_key(proposal.match_length)
                    planned = policy.plan_lookup(proposal.match_length, planned, limit).num_draft
                if planned:
                    kind, draft = "lookup", proposal.token_ids[:planned]
        if limit > 0 and kind is None and (policy or drafter == MODEL):
            planned = policy.plan_model(MODEL, limit, t - synced).num_draft if policy else limit
            if planned:
                kind, key = MODEL, MODEL
        if kind is None:
            if policy:
                policy.observe_confidence([target_top[t] >= p_min])
            spent, t = spent + 1, t + 1
            continue
        if kind == "lookup":
            accepted = 0
            while accepted < planned and out[t + accepted] == draft[accepted]:
                accepted += 1
            drafted, stopped = planned, False
            spent += cost.v(planned + 1)
        else:
            if t - synced > 2:
                spent += (t - synced) * cost.sync(MODEL)
            drafted = 0
            while drafted < planned and not (p_min and top[t + drafted] < p_min):
                drafted += 1
            stopped = drafted < planned
            accepted = 0
            while accepted < drafted and (accept[t + accepted] >= 1 if greedy
                                          else rng.random() < accept[t + accepted]):
                accepted += 1
            spent += (drafted + stopped) * cost.c(MODEL) + cost.v(drafted + 1)
        if policy:
            policy.observe_round(key, drafted, accepted, stopped)
            policy.observe_confidence([p >= p_min for p in target_top[t:t + accepted + 1]])
        t += accepted + 1
        if kind == MODEL:
            synced = t - 1
    return n / spent


def simulate(args) -> None:
    data = json.load(open(args.traces))
    for setting in args.set:
        name, value = setting.split("=")
        setattr(adaptive, name, float(value))
    cost = adaptive.CostModel.from_dict(data["costs"])
    cost.drafter_s[MODEL] = cost.drafter_s.get(MODEL, 0.0)
    settings = {f"{d} k{k}": dict(drafter=d, k=k) for d in (MODEL, "lookup") for k in (2, 4)}
    settings["auto"] = dict(auto=True)
    groups = sorted({(t["set"], t["temp"]) for t in data["traces"]})
    print("".ljust(10) + "".join(f"{s}/T={t:g}".rjust(14) for s, t in groups))
    for label, setting in settings.items():
        cells = []
        for group in groups:
            speeds = []
            for trace in (t for t in data["traces"] if (t["set"], t["temp"]) == group):
                repeats = 1 if trace["temp"] == 0 else args.repeats
                speeds.append(statistics.mean(
                    replay(trace, cost, rng=np.random.default_rng(seed),
                           policy=adaptive.AdaptivePolicy(cost.copy())
                           if setting.get("auto") else None,
                           drafter=setting.get("drafter"), k=setting.get("k", 0),
                           p_min=adaptive.AUTO_DRAFT_P_MIN if setting.get("auto") else 0.0)
                    for seed in range(repeats)))
            cells.append(statistics.median(speeds))
        print(label.ljust(10) + "".join(f"{c:14.3f}" for c in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="record traces (runs the models)")
    rec.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    rec.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    rec.add_argument("--sets", default="code,edit,chat")
    rec.add_argument("--prompts", default="0:3", help="FIRST:LAST prompt indices of each set")
    rec.add_argument("--temps", default="0,0.7")
    rec.add_argument("--max-tokens", type=int, default=128)
    rec.add_argument("--out", default="traces.json")
    sim = sub.add_parser("simulate", help="replay auto mode and fixed settings on traces")
    sim.add_argument("traces")
    sim.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                     help="override a constant of edgespec.adaptive, e.g. OPTIMISM=0.5")
    sim.add_argument("--repeats", type=int, default=2, help="sampling seeds per trace at T > 0")
    args = parser.parse_args()
    record(args) if args.command == "record" else simulate(args)


if __name__ == "__main__":
    main()
