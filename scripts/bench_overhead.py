"""The engine's own host work per committed token, with model passes that cost nothing.

Both models are :class:`~edgespec.backends.table.TableBackend` tables of
logits over a real vocabulary (151,936 ids, Qwen2.5's), so what the clock
sees is edgespec's work between passes: turning logits into probabilities,
sampling, drafting, verifying, planning, bookkeeping. On Metal or CUDA a 1.5B
target step takes ~6–10 ms; this is the part of each token that no GPU speeds up.

    python scripts/bench_overhead.py                 # the table
    python scripts/bench_overhead.py --profile draft --temp 0.7   # where the time goes
    python scripts/bench_overhead.py --profile draft --seeded     # ... with seed-invariant sampling
"""

from __future__ import annotations

import argparse
import cProfile
import io
import platform
import pstats
import statistics

from edgespec.backends.table import TableBackend
from edgespec.drafters import DraftModel, PromptLookup
from edgespec.core.engine import Engine
from edgespec.planner.factory import auto_planner
from edgespec.core.sampling import SamplingParams

QWEN_VOCAB = 151_936
# Costs where speculation hardly ever pays (two EPYC cores: verify passes and the draft
# model dear), so that the auto row is mostly what auto mode adds to a plain step.
DEAR = {"v": {"2": 1.63, "3": 2.34, "4": 2.84, "5": 3.39, "8": 4.81, "9": 4.95},
        "c": {"table-draft": 0.68}}


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def make_engine(mode: str, target: TableBackend, draft: TableBackend, k: int) -> Engine:
    if mode == "plain":
        return Engine(target, None, num_draft=1)
    if mode == "auto":
        engine, drafter = Engine(target, None, num_draft=1), DraftModel(draft)
        engine.configure(drafter, "auto", auto_planner(target, drafter, prior=DEAR))
        return engine
    drafter = DraftModel(draft) if mode == "draft" else PromptLookup()
    return Engine(target, drafter, num_draft=k)


def per_token_ms(engine: Engine, prompt: list[int], temperature: float, tokens: int,
                 speculative: bool, invariant: bool = False) -> tuple[float, float]:
    """Host milliseconds per committed token (decode only), and the acceptance rate:
    the exact rule, or seed-invariant sampling (what a seed gives by default)."""
    params = SamplingParams(temperature=temperature, seed=0, invariant=invariant)
    g = engine.generate(prompt, params, max_tokens=tokens, speculative=speculative)
    s = g.stats
    return 1000 * s.decode_time_s / s.generated_tokens, s.acceptance_rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=QWEN_VOCAB)
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5, help="runs per cell (the median is shown)")
    parser.add_argument("--noise", type=float, default=2.0, help="the drafter's logit noise")
    parser.add_argument("--profile", choices=["plain", "draft", "lookup", "auto"],
                        help="profile one mode instead and print where its time goes")
    parser.add_argument("--temp", type=float, default=0.7, help="temperature for --profile")
    parser.add_argument("--seeded", action="store_true",
                        help="with --profile: seed-invariant sampling instead of the exact rule")
    args = parser.parse_args()

    target = TableBackend.random(args.vocab, seed=0)
    draft = target.perturbed(noise=args.noise, seed=1)
    prompt = list(range(32))
    if args.profile:
        engine = make_engine(args.profile, target, draft, args.k)
        per_token_ms(engine, prompt, args.temp, 20, args.profile != "plain", args.seeded)  # warm up
        profiler = cProfile.Profile()
        profiler.enable()
        per_token_ms(engine, prompt, args.temp, args.tokens, args.profile != "plain", args.seeded)
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(12)
        print(out.getvalue())
        return

    print(f"CPU: {cpu_name()} ({platform.machine()}); vocabulary {args.vocab}; "
          f"{args.tokens} tokens; k = {args.k}; median of {args.repeats} runs")
    # T = 0.7 twice: the exact rule, and seed-invariant sampling (the race, coupling.py).
    columns = [(0.0, False), (0.7, False), (0.7, True)]
    print(f"{'mode':<22}{'T = 0':>12}{'T = 0.7':>12}{'0.7 seeded':>12}   acceptance (the same three)")
    for mode in ("plain", "draft", "lookup", "auto"):
        cells, rates = [], []
        for temperature, invariant in columns:
            engine = make_engine(mode, target, draft, args.k)
            per_token_ms(engine, prompt, temperature, 20, mode != "plain", invariant)  # warm up
            runs = [per_token_ms(engine, prompt, temperature, args.tokens, mode != "plain", invariant)
                    for _ in range(args.repeats)]
            cells.append(statistics.median(ms for ms, _ in runs))
            rates.append(runs[0][1])
        label = {"plain": "plain", "draft": f"draft model, k = {args.k}",
                 "lookup": f"prompt lookup, k = {args.k}", "auto": "auto (dear costs)"}[mode]
        rate = "" if mode == "plain" else "   " + " / ".join(f"{r:.2f}" for r in rates)
        print(f"{label:<22}" + "".join(f"{c:>9.3f} ms" for c in cells) + rate)


if __name__ == "__main__":
    main()
