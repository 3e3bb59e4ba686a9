"""Speculative decoding on a simulated GPU: achieved speedup next to the cost model's.

Both models are logit tables over a real vocabulary (151,936 ids) wrapped in
:class:`~edgespec.backends.simulated.SimulatedDevice`: each pass costs what a
GPU would take (default: target 8 ms per step, draft model 2.5 ms, v(n) =
1 + 0.05(n - 1)), and the engine's real host work comes on top. For each
setting the table shows the speedup over plain decoding (the same simulation)
and the speed model's prediction E / (k·c + v(k+1)) from the acceptance the
run measured: the gap between them is what edgespec's own work costs.

    python scripts/bench_simgpu.py
    python scripts/bench_simgpu.py --target-ms 6 --draft-ms 3 --noise 3
"""

from __future__ import annotations

import argparse
import statistics

from edgespec.backends.simulated import DeviceClock, SimulatedDevice, gpu_batch_cost
from edgespec.backends.table import TableBackend
from edgespec.planner.calibration import calibrate
from edgespec.drafters import DraftModel
from edgespec.core.engine import Engine
from edgespec.planner import PlannerConfig
from edgespec.planner.factory import auto_planner
from edgespec.core.sampling import SamplingParams
from edgespec.core.stats import GenerationStats

QWEN_VOCAB = 151_936


def expected_tokens(stats: GenerationStats, k: int) -> float:
    """E(k) = 1 + Σ_i P(drafts 1..i all accepted), measured: a round counts as
    accepted at position i only when every draft before it was accepted too."""
    total = 1.0
    for drafted, accepted in list(zip(stats.drafted_per_position, stats.accepted_per_position))[:k]:
        total += accepted / drafted if drafted else 0.0
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=QWEN_VOCAB)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--target-ms", type=float, default=8.0)
    parser.add_argument("--draft-ms", type=float, default=2.5)
    parser.add_argument("--noise", type=float, default=2.0, help="the draft model's logit noise")
    parser.add_argument("--repeats", type=int, default=3, help="runs per cell (the median is shown)")
    args = parser.parse_args()

    clock = DeviceClock()
    table = TableBackend.random(args.vocab, rows=args.tokens + 64, seed=0)
    target = SimulatedDevice(table, clock, step_seconds=args.target_ms / 1000)
    draft = SimulatedDevice(table.perturbed(noise=args.noise, seed=1), clock,
                            step_seconds=args.draft_ms / 1000)
    c = args.draft_ms / args.target_ms
    prompt = list(range(32))
    print(f"simulated GPU: target {args.target_ms:g} ms/step, draft {args.draft_ms:g} ms/step "
          f"(c = {c:.3f}), v(n) = 1 + 0.05(n-1); vocabulary {args.vocab}; {args.tokens} tokens; "
          f"median of {args.repeats} runs")
    print(f"{'setting':<16}{'T':>5}{'speedup':>10}{'predicted':>11}{'achieved/pred':>15}"
          f"{'acceptance':>12}")
    # One engine and one draft model throughout: their caches track the backends'.
    drafter = DraftModel(draft)
    engine = Engine(target, None, num_draft=1, clock=clock)
    prior = calibrate(target, [(drafter.name, draft)], clock=clock).as_prior()
    config = PlannerConfig()
    for temperature in (0.0, 0.7):
        params = SamplingParams(temperature=temperature, seed=0)

        def speed(speculative: bool = True) -> tuple[float, GenerationStats]:
            g = engine.generate(prompt, params, max_tokens=args.tokens, speculative=speculative)
            return g.stats.tokens_per_second, g.stats

        plain = statistics.median(speed(False)[0] for _ in range(args.repeats))
        results = {}
        for k in (2, 4):
            engine.configure(drafter, k)
            runs = [speed() for _ in range(args.repeats)]
            tps = statistics.median(r[0] for r in runs)
            stats = runs[0][1]
            predicted = expected_tokens(stats, k) / (k * c + gpu_batch_cost(k + 1))
            results[k] = tps / plain
            print(f"{'draft k=' + str(k):<16}{temperature:>5g}{tps / plain:>10.3f}{predicted:>11.3f}"
                  f"{tps / plain / predicted:>15.3f}{stats.acceptance_rate:>12.2f}")
        runs = []
        for _ in range(args.repeats):  # a fresh planner each run, as a new process would have
            engine.configure(drafter, "auto", auto_planner(target, drafter, config, prior=prior))
            runs.append(speed())
        tps = statistics.median(r[0] for r in runs)
        print(f"{'auto':<16}{temperature:>5g}{tps / plain:>10.3f}{'':>11}{'':>15}"
              f"{runs[0][1].acceptance_rate:>12.2f}   auto / best fixed = "
              f"{tps / plain / max(results.values()):.3f}")

if __name__ == "__main__":
    main()
