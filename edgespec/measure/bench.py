"""``edgespec bench``: which drafter, quantization and k pay off on this machine?

Every configuration (drafter × k, and auto mode) runs on the same prompts
between two plain decodings of the same prompt, temperature and repeat; each
speedup is a ratio to the mean of those two, measured side by side (a plain
run's own ratio shows how much plain decoding itself moved). The sweep also measures the
drafter cost c and the target's batch cost v(n) of this machine.
"""

from __future__ import annotations

import csv
import json
import platform
import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ..planner.calibration import calibrate
from ..core.config import DEFAULT_CONFIG
from ..drafters import DraftModel, PromptLookup
from ..core.draft import MODEL
from ..core.engine import Engine
from ..errors import EdgespecError
from ..drafters.registry import NONE, is_builtin, listed_companion, make_drafter
from ..models.loading import BackendOptions, load_backend
from ..models.arguments import pick_backend
from ..models.catalog import resolve_model
from .prompt_sets import Turn, load_conversations, turn_messages
from ..core.prompting import chat_prompt_ids
from ..planner.factory import auto_planner
from ..core.sampling import SamplingParams

SCHEMA_VERSION = 1


@dataclass
class BenchConfig:
    """What to sweep."""

    target: str
    drafters: list[str]
    num_draft: list[int] = field(default_factory=lambda: [2, 4])
    temperatures: list[float] = field(default_factory=lambda: [0.0, 0.7])
    prompt_sets: list[str] = field(default_factory=lambda: ["code", "edit", "chat"])
    prompts_per_set: int = 3
    max_tokens: int = 128
    repeat: int = 1
    auto: bool = True
    seed: int = 0
    # "exact": a draft model's own draws and the exact rule; "invariant": seed-invariant
    # sampling (edgespec.core.coupling). Every run is seeded, so the mode is set explicitly.
    sampling: list[str] = field(default_factory=lambda: ["exact"])


@dataclass
class RunRecord:
    """One generation of the sweep."""

    mode: str            # "plain", "fixed" or "auto"
    drafter: str         # "none", a drafter name, or the auto drafters
    num_draft: int       # 0 for plain and auto
    temperature: float
    prompt_set: str
    prompt_index: int
    repeat: int
    tokens: int
    tokens_per_second: float
    plain_tokens_per_second: float
    speedup: float
    rounds: int
    plain_steps: int
    drafted: int
    accepted: int
    drafted_per_position: list[int]
    accepted_per_position: list[int]
    rounds_per_drafter: dict[str, int]
    turn: int = 1        # which user turn of a conversation (1 for single prompts)
    sampling: str = "exact"


def validate(config: BenchConfig, options: BackendOptions) -> dict[str, list[list[str]]]:
    """Check every input before any model loads: prompt sets, drafters, vocabularies.

    Returns each set's conversations (a single prompt is a one-turn conversation).
    """
    prompts = {name: load_conversations(name)[:config.prompts_per_set] for name in config.prompt_sets}
    if not config.drafters:
        raise EdgespecError("no drafters to compare: give --drafters D1,D2 (models or 'lookup')")
    if any(k < 1 for k in config.num_draft):
        raise EdgespecError("invalid --num-draft: every k must be >= 1")
    if any(t < 0 for t in config.temperatures):
        raise EdgespecError("invalid --temp: temperatures must be >= 0")
    if not config.sampling or any(m not in ("exact", "invariant") for m in config.sampling):
        raise EdgespecError("invalid --sampling: give exact, invariant or both (comma-separated)")
    if config.max_tokens < 1 or config.repeat < 1 or config.prompts_per_set < 1:
        raise EdgespecError("--max-tokens, --repeat and --prompts-per-set must be >= 1")
    if pick_backend(config.target, options.backend) == "llama.cpp":
        from ..backends.gguf_tokenizer import GGUFTokenizer
        from ..backends.compat import compatibility_problems
        target = GGUFTokenizer.from_file(resolve_model(config.target, fetch=options.fetch))
        target.name = config.target
        for spec in config.drafters:
            if is_builtin(spec):
                continue
            if pick_backend(spec, options.backend) != "llama.cpp":
                continue  # MLX drafters are checked when the engine pairs them
            draft = GGUFTokenizer.from_file(resolve_model(spec, fetch=options.fetch))
            problems = compatibility_problems(target, draft)
            draft.close()
            if problems:
                raise EdgespecError(f"drafter {spec} cannot pair with {config.target}: "
                                    + "; ".join(problems))
        target.close()
    return prompts


def run_bench(config: BenchConfig, options: BackendOptions, *, progress=None, log=print) -> dict:
    """Run the sweep and return everything as one JSON-ready dict."""
    prompts = validate(config, options)
    target = load_backend(config.target, options)
    drafters, memory = {}, {}  # by display name: a model name, or a file's stem
    for spec in config.drafters:
        if is_builtin(spec):
            drafters[spec], memory[spec] = make_drafter(spec), 0
        else:
            backend = load_backend(spec, replace(options, rpc=(), kernels="fast"))  # draft models stay here
            drafters[backend.name] = DraftModel(backend)
            memory[backend.name] = backend.memory_bytes
    models = [(name, d.backend) for name, d in drafters.items() if d.kind == MODEL]
    log("measuring the target's batch cost v(n) and each drafter's step cost c ...")
    # The sizes auto mode's cached costs hold once a run has timed its long passes
    # (the calibration's sizes and the long ones), so that auto runs here from the prior it has in
    # `edgespec generate`, and every fixed k's pass.
    sizes = sorted(DEFAULT_CONFIG.saved_sizes | {k + 1 for k in config.num_draft})
    cost = calibrate(target, models, sizes=sizes)
    prior = cost.as_prior(sizes)
    engine = Engine(target, None, num_draft=max(config.num_draft, default=4))
    model_drafters = [d for d in drafters.values() if d.kind == MODEL]
    fixed = [(name, k) for name in drafters for k in config.num_draft]
    # Auto mode runs with the first draft model listed and a drafter that costs nothing
    # to ask: the suffix drafter when it is listed, else prompt lookup.
    auto_drafter = model_drafters[0] if model_drafters else None
    auto_cheap = listed_companion(drafters) or PromptLookup()
    total = (config.repeat * len(config.temperatures) * len(config.sampling)
             * sum(len(c) for p in prompts.values() for c in p) * (2 + len(fixed) + config.auto))
    runs: list[RunRecord] = []
    done = 0
    sweeps = [(repeat, temperature, sampling) for repeat in range(config.repeat)
              for temperature in config.temperatures for sampling in config.sampling]
    for repeat, temperature, sampling in sweeps:
        for set_name, conversations in prompts.items():
            for index, turns in enumerate(conversations):
                params = SamplingParams(temperature=temperature, seed=config.seed + repeat,
                                        invariant=sampling == "invariant")
                plans = [("plain", NONE, 0)] + [("fixed", name, k) for name, k in fixed]
                if config.auto:
                    plans.append(("auto", auto_drafter.name if auto_drafter else auto_cheap.name, 0))
                plans.append(("plain", NONE, 0))
                replies = []  # per plan, a generation per turn
                for mode, name, k in plans:
                    replies.append([])
                    drafter = auto_cheap if mode == "auto" and auto_drafter is None \
                        else drafters.get(name)
                    for g in _run_conversation(engine, target, mode, drafter, k, prior, turns,
                                               params, config, auto_cheap):
                        replies[-1].append(g)
                        done += 1
                        if progress:
                            progress(done, total, _record(mode, g.stats.drafter, k, temperature,
                                                          set_name, index, repeat, g, 0.0,
                                                          sampling=sampling))
                # Plain decoding before and after the modes: their mean is the base, so a
                # machine that speeds up or slows down during the prompt biases no mode.
                for turn in range(len(turns)):
                    base = statistics.mean(replies[i][turn].stats.tokens_per_second for i in (0, -1))
                    # Later turns of a conversation are a set of their own: they are
                    # where earlier answers can be drafted from.
                    name = set_name if turn == 0 else f"{set_name}@2+"
                    for (mode, _, k), gens in zip(plans, replies):
                        runs.append(_record(mode, gens[turn].stats.drafter, k, temperature, name,
                                            index, repeat, gens[turn], base, turn + 1, sampling))
    result = {
        "schema_version": SCHEMA_VERSION,
        "machine": {"node": platform.node(), "machine": platform.machine(),
                    "processor": platform.processor(), "python": platform.python_version()},
        "target": config.target,
        "target_rpc": list(options.rpc),  # rpc-servers holding the target's layers, if any
        "config": asdict(config),
        "costs": {"v": prior["v"], "c": {name: cost.c(name) for name, _ in models},
                  "target_step_seconds": cost.step_seconds},
        "drafter_memory_bytes": memory,
        "runs": [asdict(r) for r in runs],
    }
    result["summary"] = summarize(runs, memory)
    result["recommendation"] = recommend(result["summary"])
    engine.configure(None, 1)  # the engine closes the target; each drafter is closed once below
    engine.close()
    for d in model_drafters:
        d.backend.close()
    return result


def _run_conversation(engine: Engine, target, mode: str, drafter, k: int, prior: dict,
                      turns: list[Turn], params, config, cheap):
    """Yield a generation per user turn: plain decoding, a fixed drafter and k, or
    auto mode (over ``cheap``, prompt lookup or the suffix drafter, and
    ``drafter``), with the conversation, the KV cache and the drafters' state
    carried from turn to turn as in ``edgespec chat``."""
    for d in (drafter, cheap) if mode == "auto" else (drafter,):
        if d is not None:
            d.forget()  # each conversation starts with an empty drafter memory
    if mode == "auto":
        # A fresh planner per conversation (a new process's first generation), starting
        # from the costs measured at the start of the sweep.
        engine.configure(drafter, "auto", auto_planner(target, drafter, prior=prior, cheap=cheap))
    elif mode == "fixed":
        engine.configure(drafter, k)  # no stop: auto mode gives its learned one back
    messages = []
    for user in turns:
        ids = chat_prompt_ids(target, turn_messages(messages, user))
        generation = engine.generate(ids, params, max_tokens=config.max_tokens,
                                     speculative=mode != "plain")
        messages.append({"role": "assistant", "content": generation.text})
        yield generation


def _record(mode, drafter, k, temperature, set_name, index, repeat, g, base, turn=1,
            sampling="exact") -> RunRecord:
    s = g.stats
    return RunRecord(mode, drafter, k, temperature, set_name, index, repeat, s.generated_tokens,
                     s.tokens_per_second, base, s.tokens_per_second / base if base else 0.0,
                     s.rounds, s.plain_steps, s.drafted, s.accepted, list(s.drafted_per_position),
                     list(s.accepted_per_position), dict(s.rounds_per_drafter), turn, sampling)


def summarize(runs: list[RunRecord], memory: dict[str, int]) -> list[dict]:
    """One row per (mode, drafter, k, temperature, sampling, prompt set)."""
    groups: dict[tuple, list[RunRecord]] = {}
    for r in runs:
        groups.setdefault((r.mode, r.drafter, r.num_draft, r.temperature, r.sampling, r.prompt_set),
                          []).append(r)
    rows = []
    for (mode, drafter, k, temperature, sampling, set_name), rs in groups.items():
        drafted, accepted, rounds = (sum(r.drafted for r in rs), sum(r.accepted for r in rs),
                                     sum(r.rounds for r in rs))
        width = max((len(r.drafted_per_position) for r in rs), default=0)
        per_d = [sum(r.drafted_per_position[i] for r in rs if i < len(r.drafted_per_position))
                 for i in range(width)]
        per_a = [sum(r.accepted_per_position[i] for r in rs if i < len(r.accepted_per_position))
                 for i in range(width)]
        speedups = [r.speedup for r in rs]
        base_name = drafter.split("(")[-1].rstrip(")").split("+")[-1] if mode == "auto" else drafter
        rows.append({
            "mode": mode, "drafter": drafter, "num_draft": k, "temperature": temperature,
            "sampling": sampling,
            "prompt_set": set_name, "runs": len(rs),
            "acceptance_rate": accepted / drafted if drafted else 0.0,
            "mean_accepted_length": 1 + accepted / rounds if rounds else 1.0,
            "acceptance_per_position": [a / d if d else 0.0 for a, d in zip(per_a, per_d)],
            "tokens_per_second": statistics.median(r.tokens_per_second for r in rs),
            # The headline: a mode's effect on speed is a factor, so its typical factor over
            # prompts is their geometric mean. It uses every prompt, where the median of a
            # few prompts is one of them (and jumps when a set mixes prompts that copy and
            # prompts that do not). The median and the range stay alongside.
            "speedup_geomean": statistics.geometric_mean(max(x, 1e-9) for x in speedups),
            "speedup_median": statistics.median(speedups),
            "speedup_min": min(speedups), "speedup_max": max(speedups),
            "drafter_memory_bytes": memory.get(base_name, 0),
        })
    return rows


def recommend(summary: list[dict]) -> dict:
    """The setting with the best geometric-mean speedup over prompt sets and temperatures."""
    scores: dict[tuple, list[float]] = {}
    for row in summary:
        if row["mode"] == "plain":
            continue
        scores.setdefault((row["mode"], row["drafter"], row["num_draft"]), []).append(
            max(row["speedup_geomean"], 1e-9))
    if not scores:
        return {"mode": "plain", "reason": "no speculative configuration was measured"}
    geo = {key: statistics.geometric_mean(v) for key, v in scores.items()}
    (mode, drafter, k), speed = max(geo.items(), key=lambda item: item[1])
    if speed <= 1.0:
        return {"mode": "plain", "speedup": 1.0,
                "reason": f"nothing beat plain decoding (best: {drafter} k={k}, {speed:.2f}x)"}
    draft = drafter.split("(")[-1].rstrip(")").split("+")[-1] if mode == "auto" else drafter
    return {"mode": mode, "drafter": draft, "num_draft": "auto" if mode == "auto" else k,
            "speedup": speed, "reason": "best geometric-mean speedup over sets and temperatures"}


# -- output --------------------------------------------------------------------------


def write_json(result: dict, path: Path) -> None:
    path.write_text(json.dumps(result, indent=1))


def write_csv(result: dict, path: Path) -> None:
    rows = result["summary"]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({**row, "acceptance_per_position":
                             " ".join(f"{a:.3f}" for a in row["acceptance_per_position"])})


def write_plot(result: dict, path: Path) -> None:
    """Speedup vs k per drafter, and acceptance per draft position (matplotlib)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fixed = [r for r in result["summary"] if r["mode"] == "fixed"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for drafter in dict.fromkeys(r["drafter"] for r in fixed):
        for temperature in dict.fromkeys(r["temperature"] for r in fixed):
            mine = [r for r in fixed if r["drafter"] == drafter and r["temperature"] == temperature]
            ks = sorted({r["num_draft"] for r in mine})
            speed = [statistics.geometric_mean(r["speedup_geomean"] for r in mine if r["num_draft"] == k)
                     for k in ks]
            left.plot(ks, speed, marker="o", label=f"{drafter} T={temperature:g}")
        mine = [r for r in fixed if r["drafter"] == drafter]
        longest = max(mine, key=lambda r: len(r["acceptance_per_position"]))
        positions = range(1, len(longest["acceptance_per_position"]) + 1)
        right.plot(list(positions), [statistics.mean(r["acceptance_per_position"][i]
                                                     for r in mine if i < len(r["acceptance_per_position"]))
                                     for i in range(len(positions))], marker="o", label=drafter)
    for row in (r for r in result["summary"] if r["mode"] == "auto"):
        left.axhline(row["speedup_geomean"], color="grey", alpha=0.15)
    left.axhline(1.0, color="black", linewidth=1, linestyle="--")
    for axis in (left, right):
        axis.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    left.set(xlabel="k (tokens drafted per round)", ylabel="speedup vs plain (geometric mean over prompts)",
             title=f"{result['target']}: speedup vs k (grey: auto)")
    right.set(xlabel="draft position", ylabel="acceptance rate", ylim=(0, 1.05),
              title="acceptance per draft position")
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
