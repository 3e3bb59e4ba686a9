"""Benchmark edgespec on llama.cpp: plain vs draft model, prompt lookup, the suffix
drafter and auto mode, interleaved.

For each prompt of each set (code generation, code editing, chat) the modes
run one after the other on the same loaded models, so every ratio to plain
decoding is measured side by side. With ``--reference`` llama.cpp's own
``llama-bench`` and ``llama-speculative-simple`` (built from the llama.cpp
inside llama-cpp-python) run on the same files, prompts and threads: with
the draft model (the same k), and in each of its n-gram modes (no draft
model; llama.cpp's default sizes, and its map modes sized like edgespec's lookup).

    python scripts/bench_llamacpp.py --reference
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from edgespec import DraftModel, Engine, PromptLookup, SamplingParams  # noqa: E402
from edgespec.backends.llamacpp import LlamaCppBackend  # noqa: E402
from edgespec.drafters.suffix import SuffixDrafter  # noqa: E402
from edgespec.planner.factory import auto_planner  # noqa: E402
from edgespec.models.catalog import resolve_model  # noqa: E402
from edgespec.measure.prompt_sets import load_prompt_set  # noqa: E402
from edgespec.core.prompting import chat_prompt_ids  # noqa: E402
from llamacpp_reference import NGRAM_MODES  # noqa: E402

MODES = ("plain", "draft", "lookup", "suffix", "auto")


@dataclass
class Run:
    mode: str
    prompt_set: str
    prompt_index: int
    tokens: int
    tokens_per_second: float
    acceptance_rate: float = 0.0
    mean_accepted_length: float = 1.0
    text: str = ""
    token_ids: list[int] = field(default_factory=list)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--sets", default="code,edit,chat")
    parser.add_argument("--prompts", type=int, default=3, help="prompts per set")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--num-draft", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--temp", type=float, default=0.0)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("-ngl", "--n-gpu-layers", type=int, default=0)
    parser.add_argument("--modes", default=",".join(MODES), help="edgespec modes to run "
                        "(auto: over prompt lookup and the draft model, from this pair's cached costs)")
    parser.add_argument("--reference", action="store_true",
                        help="also run llama-bench and llama-speculative-simple side by side")
    parser.add_argument("--json", type=Path, default=None, help="write every run here")
    args = parser.parse_args()
    console = Console(width=170)

    target_path = resolve_model(args.target, fetch=True)
    draft_path = resolve_model(args.draft, fetch=True)
    options = dict(n_ctx=args.ctx, n_threads=args.threads, n_gpu_layers=args.n_gpu_layers)
    target = LlamaCppBackend(target_path, **options)
    draft_model = DraftModel(LlamaCppBackend(draft_path, **options))
    drafters = {"draft": draft_model, "lookup": PromptLookup(), "suffix": SuffixDrafter()}
    modes = [m for m in MODES if m in args.modes.split(",")]
    engine = Engine(target, None, num_draft=args.num_draft)
    params = SamplingParams(temperature=args.temp, seed=0)

    reference = None
    if args.reference:
        import llamacpp_reference as ref
        bin_dir = ref.build_reference(log=console.print)
        reference = {"bin": bin_dir, "spec": {}, "bench": []}  # spec: (spec type, set, index) -> result

    runs: list[Run] = []
    for set_name in args.sets.split(","):
        for index, prompt in enumerate(load_prompt_set(set_name)[:args.prompts]):
            messages = [{"role": "user", "content": prompt}]
            prompt_ids = chat_prompt_ids(target, messages)
            for mode in modes:
                if mode == "auto":  # a fresh planner per prompt: a new process's first run
                    engine.configure(draft_model, "auto", auto_planner(engine.target_cache, draft_model))
                elif mode != "plain":
                    engine.configure(drafters[mode], args.num_draft)
                drafters["suffix"].forget()  # no memory of the other prompts
                g = engine.generate(prompt_ids, params, max_tokens=args.max_tokens,
                                    speculative=mode != "plain")
                s = g.stats
                runs.append(Run(mode, set_name, index, s.generated_tokens, s.tokens_per_second,
                                s.acceptance_rate, s.mean_accepted_length, g.text, g.token_ids))
                console.print(f"{set_name}[{index}] {mode:6} {s.generated_tokens:4d} tok "
                              f"{s.tokens_per_second:6.2f} tok/s  acc {s.acceptance_rate:5.1%}  "
                              f"τ {s.mean_accepted_length:.2f}")
            if reference:
                text = target.apply_chat_template(messages)
                for spec_type in ("draft-simple", *ref.NGRAM_MODES):
                    r = ref.speculative_simple(reference["bin"], target_path, draft_path, text,
                                               threads=args.threads, num_draft=args.num_draft,
                                               max_tokens=args.max_tokens, n_ctx=args.ctx,
                                               spec_type=spec_type)
                    reference["spec"][(spec_type, set_name, index)] = r
                    console.print(f"{set_name}[{index}] llama.cpp {spec_type} {r.decoded:4d} tok "
                                  f"{r.tokens_per_second:6.2f} tok/s  acc {r.acceptance_rate:5.1%}")
                reference["bench"].append(ref.llama_bench_tg(
                    reference["bin"], target_path, threads=args.threads, n_gen=args.max_tokens,
                    repetitions=1))

    report(console, runs, modes, reference, args)
    if args.json:
        out = {"runs": [r.__dict__ for r in runs]}
        if reference:
            out["reference"] = [{"spec_type": t, "prompt_set": n, "prompt_index": i, **r.__dict__}
                                for (t, n, i), r in reference["spec"].items()]
            out["llama_bench_tg"] = reference["bench"]
        args.json.write_text(json.dumps(out, indent=1))
    return 0


def report(console: Console, runs: list[Run], modes: list[str], reference, args) -> None:
    table = Table(title=f"edgespec on llama.cpp — k={args.num_draft}, temp {args.temp}, "
                        f"{args.threads} threads, {args.max_tokens} tokens max")
    for column in ("set", "mode", "tok/s (median)", "× plain (median)", "× plain (min–max)",
                   "acceptance", "mean acc. length", "greedy = plain"):
        table.add_column(column, justify="right")
    sets = list(dict.fromkeys(r.prompt_set for r in runs))
    for set_name in sets:
        plain = {r.prompt_index: r for r in runs if r.prompt_set == set_name and r.mode == "plain"}
        for mode in modes:
            mine = [r for r in runs if r.prompt_set == set_name and r.mode == mode]
            ratios = [r.tokens_per_second / plain[r.prompt_index].tokens_per_second for r in mine]
            same = sum(r.token_ids == plain[r.prompt_index].token_ids for r in mine)
            table.add_row(set_name, mode, f"{statistics.median(r.tokens_per_second for r in mine):.2f}",
                          f"{statistics.median(ratios):.2f}", f"{min(ratios):.2f}–{max(ratios):.2f}",
                          "" if mode == "plain" else f"{statistics.mean(r.acceptance_rate for r in mine):.1%}",
                          "" if mode == "plain" else f"{statistics.mean(r.mean_accepted_length for r in mine):.2f}",
                          f"{same}/{len(mine)}" if args.temp == 0 else "n/a")
        for spec_type in (reference and ("draft-simple", *NGRAM_MODES)) or ():
            specs = [(i, reference["spec"][(spec_type, set_name, i)]) for i in plain]
            # Against edgespec's plain decoding of the same prompt, run just before.
            ratios = [r.tokens_per_second / plain[i].tokens_per_second for i, r in specs]
            # llama.cpp finishes its last round past -n: compare the common length.
            same = sum(r.text.startswith(plain[i].text) or plain[i].text.startswith(r.text)
                       for i, r in specs)
            table.add_row(set_name, f"llama.cpp {spec_type}",
                          f"{statistics.median(r.tokens_per_second for _, r in specs):.2f}",
                          f"{statistics.median(ratios):.2f}", f"{min(ratios):.2f}–{max(ratios):.2f}",
                          f"{statistics.mean(r.acceptance_rate for _, r in specs):.1%}", "",
                          f"{same}/{len(specs)}")
    console.print(table)
    if reference:
        plain_all = [r.tokens_per_second for r in runs if r.mode == "plain"]
        draft_all = {(r.prompt_set, r.prompt_index): r.tokens_per_second
                     for r in runs if r.mode == "draft"}
        bench = statistics.mean(reference["bench"])
        spec_ratio = statistics.median(draft_all[key[1:]] / r.tokens_per_second
                                       for key, r in reference["spec"].items()
                                       if key[0] == "draft-simple" and key[1:] in draft_all) \
            if draft_all else float("nan")
        console.print(f"llama-bench tg{args.max_tokens}: {bench:.2f} tok/s (mean of "
                      f"{len(reference['bench'])} runs interleaved with the prompts); edgespec plain "
                      f"median {statistics.median(plain_all):.2f} tok/s = "
                      f"{statistics.median(plain_all) / bench:.3f}× llama-bench")
        console.print(f"edgespec draft-model / llama-speculative-simple, per prompt: "
                      f"median {spec_ratio:.3f}×")


if __name__ == "__main__":
    sys.exit(main())
