"""edgespec auto mode against llama.cpp's n-gram speculation and the copy ceiling, on
the same templated prompts, every ratio taken against edgespec plain decoding.

For each prompt (each turn of a conversation, its history being plain decoding's
replies, so that every mode sees the same prompt) the modes run one after another,
each between two plain decodings of the same prompt; a mode's speedup is its speed
over the mean of those two. The modes:

- ``auto``: edgespec auto mode with its default drafters (what ``edgespec chat``
  uses: prompt lookup, and the draft model of the default pairing unless
  ``--draft none``), one planner per conversation carried over its turns as in a chat;
- llama.cpp's ``llama-speculative-simple`` (built from the llama.cpp inside
  llama-cpp-python) with ``--spec-type ngram-simple``, ``ngram-map-k`` and
  ``ngram-mod`` at their defaults, and ``ngram-map-k`` drafting up to 64 tokens
  (edgespec's longest draft);
- ``map-k rule``: llama.cpp's ngram-map-k rule (a 12-token key, drafts of up to 48
  tokens, as many as were accepted last time after the same key) as an edgespec
  drafter: the same rule on edgespec's kernels, where llama.cpp's own run differs in
  its kernels too (``--no-repack`` on CPUs with AMX; see edgespec/backends/repack.py);
- ``ceiling``: the copy ceiling on plain decoding's reply (edgespec/measure/ceiling.py) with
  drafts of up to 64 tokens, v(n) measured at the start of the run.

It prints one table per prompt set (a conversation set's later turns, ``SET@2+``,
apart): geometric mean, median and min-max over its prompts and repeats, and auto
mode's ratio to the best llama.cpp mode and to the ceiling.

    python scripts/bench_ngram.py --sets edit-val,edit-chain-val --repeat 2 --json bench-out/ngram.json
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import numpy as np  # noqa: E402

from edgespec.measure.ceiling import ceiling, copy_lengths  # noqa: E402
from edgespec.planner.calibration import calibrate  # noqa: E402
from edgespec.planner.costs import CostModel  # noqa: E402
from edgespec.core.draft import Draft, DrafterBase  # noqa: E402
from edgespec.measure.prompt_sets import load_conversations, turn_messages  # noqa: E402
from edgespec.core.prompting import chat_prompt_ids  # noqa: E402
from edgespec.core.sampling import SamplingParams  # noqa: E402

LLAMA_MODES = {
    "ngram-simple": ["--spec-type", "ngram-simple"],
    "ngram-map-k": ["--spec-type", "ngram-map-k"],
    "ngram-mod": ["--spec-type", "ngram-mod"],
    "ngram-map-k m64": ["--spec-type", "ngram-map-k", "--spec-ngram-map-k-size-m", "64"],
}
LONGEST = 64  # edgespec's longest draft, and the ceiling's
CEILING_SIZES = (1, 2, 3, 4, 5, 8, 9, 12, 16, 17, 24, 32, 33, 48, 64, 65)


class MapKRule(DrafterBase):
    """llama.cpp's ngram-map-k (common/ngram-map.cpp, key-only mode) as an edgespec
    drafter: after the context's last ``key`` tokens, the ``value`` tokens that
    followed their most recent earlier occurrence (one that leaves room for them),
    but no more than were accepted the last time a draft followed the same key."""

    name = "map-k rule"
    kind = "copy"

    def __init__(self, key: int = 12, value: int = 48):
        self.key, self.value = key, value
        self.reset()

    def reset(self) -> None:
        self._tokens: list[int] = []
        self._positions: dict[tuple[int, ...], list[int]] = {}
        self._accepted: dict[tuple[int, ...], int] = {}
        self._last: tuple[int, ...] | None = None

    def _follow(self, context) -> None:
        if list(context[:len(self._tokens)]) != self._tokens:
            self.reset()
        start = len(self._tokens)
        self._tokens.extend(int(t) for t in context[start:])
        for j in range(max(0, start - self.key + 1), len(self._tokens) - self.key + 1):
            self._positions.setdefault(tuple(self._tokens[j:j + self.key]), []).append(j)

    def propose(self, context, num_draft, params, rng, *, min_confidence=None) -> Draft:
        self._follow(context)
        tokens, n, m = self._tokens, self.key, self.value
        self._last = None
        if len(tokens) < 2 * n + m:
            return Draft([])
        key = tuple(tokens[-n:])
        positions = self._positions.get(key, [])
        i = bisect.bisect_right(positions, len(tokens) - n - m - 1) - 1
        if i < 0:
            return Draft([])
        self._last = key
        length = min(m, self._accepted.setdefault(key, m), num_draft)
        start = positions[i] + n
        return Draft(tokens[start:start + length])

    def accepted(self, num_accepted: int) -> None:
        if self._last is not None:
            self._accepted[self._last] = num_accepted

    def prefill(self, context) -> int:
        self._follow(context)
        return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--draft", default="default",
                        help="auto mode's draft model ('default': the default pairing's; 'none')")
    parser.add_argument("--sets", default="edit-val,edit-chain-val")
    parser.add_argument("--prompts-per-set", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--temp", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("-ngl", "--n-gpu-layers", type=int, default=0)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--llama-modes", default=",".join(LLAMA_MODES),
                        help="llama.cpp modes to run ('' for none)")
    parser.add_argument("--no-map-k-rule", action="store_true", help="leave out the map-k rule row")
    parser.add_argument("--no-repack", action="store_true",
                        help="edgespec without repacked weights, as llama.cpp's tools run on AMX CPUs")
    parser.add_argument("--no-context-costs", dest="context_costs", action="store_false",
                        help="the ceiling from the costs timed at the start (a short context), "
                             "not from each request's own context")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.no_repack:
        os.environ["EDGESPEC_LLAMA_REPACK"] = "0"

    import edgespec
    from edgespec.planner.factory import auto_planner
    from edgespec.models.catalog import defaults, resolve_model

    draft = defaults()["chat"]["draft"] if args.draft == "default" else args.draft
    draft = None if draft == "none" else draft
    engine = edgespec.load(args.target, draft=draft, n_ctx=args.ctx, n_threads=args.threads,
                           n_gpu_layers=args.n_gpu_layers)
    target, drafter = engine.target, engine.drafter
    engine.configure(drafter, 4)  # (auto mode gets a fresh planner per conversation below)
    print("measuring v(n) for the ceiling ...", file=sys.stderr, flush=True)
    cost = calibrate(target, [], sizes=CEILING_SIZES, repeats=3)
    v = {n: cost.v(n) for n in range(1, LONGEST + 2)}
    print(f"plain step {cost.step_seconds * 1000:.1f} ms; "
          + " ".join(f"v({n})={v[n]:.2f}" for n in CEILING_SIZES if n > 1), file=sys.stderr)

    llama_modes = [m for m in args.llama_modes.split(",") if m]
    bin_dir = None
    if llama_modes:
        import llamacpp_reference as ref
        bin_dir = ref.build_reference(log=lambda s: print(s, file=sys.stderr))
        target_path = resolve_model(args.target, fetch=True)
    params = SamplingParams(temperature=args.temp, seed=0)
    map_k = MapKRule()
    rows = []
    for repeat in range(args.repeat):
        for set_name in args.sets.split(","):
            for index, turns in enumerate(load_conversations(set_name)[:args.prompts_per_set]):
                # One per conversation, as in a chat, through the engine's caches.
                planner = auto_planner(engine.target_cache, drafter)
                messages = []
                for turn, user in enumerate(turns, 1):
                    prompt = turn_messages(messages, user)
                    label = set_name if turn == 1 else f"{set_name}@2+"
                    ids = chat_prompt_ids(target, prompt)
                    # llama.cpp's modes on what can copy: a captured request, a single
                    # prompt, a conversation's later turns.
                    copies = not isinstance(user, str) or turn > 1 or len(turns) == 1
                    speeds, plain = _run_prompt(engine, drafter, planner, map_k, ids, params, args,
                                                llama_modes if copies else [],
                                                bin_dir, target, prompt,
                                                target_path if llama_modes else None)
                    reply = plain.token_ids
                    # The ceiling at this request's own costs: a pass attends to all that is
                    # cached, so after a long prompt long passes cost more than the costs
                    # timed at the start of the run say.
                    here = context_costs(engine, ids, reply) if args.context_costs else v
                    bound = ceiling(copy_lengths(ids, reply, LONGEST), here.__getitem__)
                    plain_seconds = plain.stats.prefill_time_s + plain.stats.decode_time_s
                    speeds["ceiling"] = {"speedup": bound, "whole_speedup": plain_seconds / (
                        plain.stats.prefill_time_s + plain.stats.decode_time_s / bound)}
                    rows.append({"set": label, "index": index, "turn": turn, "repeat": repeat,
                                 "tokens": len(reply), "modes": speeds})
                    print(f"{label}:{index} turn {turn} r{repeat}: " + ", ".join(
                        f"{mode} {s['speedup']:.2f}" for mode, s in speeds.items()), file=sys.stderr, flush=True)
                    messages.append({"role": "assistant", "content": plain.text})
                # Its measured costs are the next conversation's prior, as for consecutive
                # `edgespec generate` runs.
                planner.close()  # (saves its costs; it goes on planning)
    engine.close()
    report(rows)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"v": v, "step_seconds": cost.step_seconds,
                                         "args": {k: str(x) for k, x in vars(args).items()},
                                         "rows": rows}, indent=1))
    return 0


def context_costs(engine, ids, reply, repeats: int = 2) -> dict[int, float]:
    """v(n) at this request's context (its prompt and half its reply cached, as plain
    decoding left them), n = 1..LONGEST + 1: passes timed there, interleaved, after a
    warm-up, each size's median over the median plain step."""
    cache = engine.target_cache
    start = len(ids) + len(reply) // 2
    cache.sync(list(ids) + list(reply[:len(reply) // 2]), need_logits=False)  # (cached: nothing to do)
    filler = list(reply) * (LONGEST // max(1, len(reply)) + 2)
    cost = CostModel()
    for repeat in range(repeats + 1):
        for n in CEILING_SIZES:
            began = time.perf_counter()
            cache.forward(filler[:n])
            seconds = time.perf_counter() - began
            cache.rewind(start)
            if repeat:
                cost.observe_target(n, seconds)
    return {n: cost.v(n) for n in range(1, LONGEST + 2)}


def _run_prompt(engine, drafter, planner, map_k, ids, params, args, llama_modes, bin_dir, target,
                messages, target_path):
    """Each mode between two plain decodings of ``ids``: {mode: figures}, and the first
    plain decoding (its reply is the conversation's history for the next turn).

    Each figure has the decode speedup (tokens per second of decoding over the mean of the
    two plain runs around it) and the whole request's (prompt processing included, as a
    client waits for it: the same number of tokens at each side's decoding speed, after
    each side's own prompt processing). The first plain run and the auto run start from
    an empty cache, so both process the whole prompt; the plain runs in between reuse it.
    """
    import llamacpp_reference as ref

    def plain_run(cold=False):
        engine.configure(drafter, 4)
        if cold:
            engine.target_cache.rewind(0)
        return engine.generate(ids, params, max_tokens=args.max_tokens, speculative=False)

    first = before = plain_run(cold=True)
    plain_prefill = first.stats.prefill_time_s
    speeds = {}

    def record(mode, tokens, tokens_per_second, prefill_seconds, drafted, accepted, same):
        nonlocal before
        after = plain_run()
        base = statistics.mean([before.stats.tokens_per_second, after.stats.tokens_per_second])
        whole_plain = plain_prefill + tokens / base
        whole = prefill_seconds + tokens / tokens_per_second
        speeds[mode] = {"speedup": tokens_per_second / base, "whole_speedup": whole_plain / whole,
                        "tokens_per_second": tokens_per_second, "prefill_seconds": prefill_seconds,
                        "plain_tokens_per_second": base, "plain_prefill_seconds": plain_prefill,
                        "tokens": tokens, "drafted": drafted, "accepted": accepted, "same_as_plain": same}
        before = after

    engine.configure(drafter, "auto", planner)
    engine.target_cache.rewind(0)
    g = engine.generate(ids, params, max_tokens=args.max_tokens)
    record("auto", g.stats.generated_tokens, g.stats.tokens_per_second, g.stats.prefill_time_s,
           g.stats.drafted, g.stats.accepted, g.token_ids == first.token_ids)
    if not args.no_map_k_rule:
        engine.configure(map_k, map_k.value)
        g = engine.generate(ids, params, max_tokens=args.max_tokens)
        record("map-k rule", g.stats.generated_tokens, g.stats.tokens_per_second, plain_prefill,
               g.stats.drafted, g.stats.accepted, g.token_ids == first.token_ids)
    text = target.apply_chat_template(messages)
    for mode in llama_modes:
        # As many tokens as plain decoding gave (it stops at the end token too).
        r = ref.speculative_simple(bin_dir, target_path, None, text, threads=args.threads or 2,
                                   num_draft=0, max_tokens=max(1, len(first.token_ids)), n_ctx=args.ctx,
                                   spec_args=LLAMA_MODES[mode], n_gpu_layers=args.n_gpu_layers)
        # llama.cpp finishes its last round past -n: compare the common length.
        same = r.text.startswith(first.text) or first.text.startswith(r.text)
        record(f"llama.cpp {mode}", r.decoded, r.tokens_per_second, r.prompt_seconds, r.drafted,
               r.accepted, same)
    return speeds, first


def report(rows) -> None:
    """One table per set: each mode's decode and whole-request speed over plain decoding."""
    modes = list(dict.fromkeys(m for r in rows for m in r["modes"]))
    llama = [m for m in modes if m.startswith("llama.cpp")]
    for set_name in dict.fromkeys(r["set"] for r in rows):
        mine = [r for r in rows if r["set"] == set_name]
        print(f"\n{set_name}: {len(mine)} prompt runs, x plain decoding "
              f"(decode: geometric mean, median, min-max; whole request: geometric mean, min-max)")
        print(f"{'mode':26s} {'decode':>7s} {'median':>7s} {'min-max':>11s} {'whole':>7s} "
              f"{'min-max':>11s} {'accepted':>9s}")
        geo = {}
        for mode in modes:
            figures = [r["modes"][mode] for r in mine if mode in r["modes"]]
            if not figures:
                continue
            values = [f["speedup"] for f in figures]
            whole = [f["whole_speedup"] for f in figures if "whole_speedup" in f]
            geo[mode] = statistics.geometric_mean(values)
            drafted = sum(f.get("drafted", 0) for f in figures)
            accepted = sum(f.get("accepted", 0) for f in figures)
            print(f"{mode:26s} {geo[mode]:7.3f} {statistics.median(values):7.3f} "
                  f"{min(values):5.2f}-{max(values):<5.2f} "
                  + (f"{statistics.geometric_mean(whole):7.3f} {min(whole):5.2f}-{max(whole):<5.2f} "
                     if whole else f"{'':>7s} {'':>11s} ")
                  + (f"{accepted / drafted:9.1%}" if drafted else f"{'':>9s}"))
        best = max(llama, key=lambda m: geo.get(m, 0.0), default=None)
        if "auto" in geo and best in geo:
            print(f"auto / best llama.cpp ({best}): {geo['auto'] / geo[best]:.3f}")
        if "auto" in geo and "ceiling" in geo:
            print(f"auto / ceiling: {geo['auto'] / geo['ceiling']:.3f}")
        if "auto" in geo and "map-k rule" in geo:
            print(f"auto / map-k rule: {geo['auto'] / geo['map-k rule']:.3f}")


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
