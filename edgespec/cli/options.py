"""What the command line's options (:mod:`.flags`) describe: the engine, sampling, shaping."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ..core.prompt_disk import default_budget_mib as disk_budget_mib
from ..core.prompt_disk import default_folder
from ..errors import EdgespecError
from ..drafters import registry
from ..models.loading import BackendOptions


def backend_options(args, **more) -> BackendOptions:
    """The target's backend options given on the command line (and ``more``)."""
    return BackendOptions(backend=args.backend, n_ctx=args.ctx, n_threads=args.threads,
                          n_gpu_layers=args.n_gpu_layers,
                          flash_attn={"auto": None, "on": True, "off": False}[args.flash_attn],
                          mlx_quantize=args.mlx_quantize, kernels=args.kernels,
                          n_batch=args.n_batch, n_ubatch=args.n_ubatch, type_k=args.type_k,
                          type_v=args.type_v, use_mmap=args.use_mmap,
                          chat_template=chat_template(args), **more)


def chat_template(args) -> str | None:
    """``--chat-template`` (a name or Jinja), or ``--chat-template-file``'s text, checked."""
    from ..core.chat_template import chat_template_from
    if args.chat_template_file is None:
        return None if args.chat_template is None else \
            chat_template_from(args.chat_template, "--chat-template")
    if args.chat_template is not None:
        raise EdgespecError("--chat-template and --chat-template-file both give the template: use one")
    return chat_template_from(read_text(args.chat_template_file, "--chat-template-file"),
                              "--chat-template-file")


def read_text(path: str, flag: str) -> str:
    """A text file a flag names, or a clear error."""
    try:
        return Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise EdgespecError(f"cannot read {flag} {path}: {why}") from None


# A field's flag, for messages the checks of SamplingParams and Shaping write.
FLAGS = {"temperature": "--temp", "top_k": "--top-k", "top_p": "--top-p", "min_p": "--min-p",
         "typical_p": "--typical", "seed": "-s", "repeat_penalty": "--repeat-penalty",
         "repeat_last_n": "--repeat-last-n", "presence_penalty": "--presence-penalty",
         "frequency_penalty": "--frequency-penalty"}


def _flagged(exc: ValueError) -> EdgespecError:
    """A check's message ("invalid top_k=-1: ...") as the command line says it."""
    message = str(exc)
    for name, flag in FLAGS.items():
        message = message.replace(f"invalid {name}=", f"invalid {flag} ")
    return EdgespecError(message.replace(", or None for a random seed", " (-1: a new seed)"))


def sampling_params(args):
    """The sampling options given on the command line, validated (``-s -1``: a new seed
    each time, as llama.cpp's)."""
    from ..core.sampling import SamplingParams
    try:
        return SamplingParams(temperature=args.temp, top_k=args.top_k, top_p=args.top_p,
                              min_p=args.min_p, typical_p=args.typical,
                              seed=None if args.seed == -1 else args.seed,
                              invariant=None if args.sampling is None else args.sampling == "invariant")
    except ValueError as exc:
        raise _flagged(exc) from None


def penalties(args) -> dict:
    """The penalties given on the command line (checked), by a request's field names
    (``--repeat-last-n -1``: the whole context, as llama.cpp's)."""
    from ..core.shaping import Shaping
    given = {"repeat_penalty": args.repeat_penalty,
             "repeat_last_n": args.ctx if args.repeat_last_n == -1 else args.repeat_last_n,
             "presence_penalty": args.presence_penalty, "frequency_penalty": args.frequency_penalty}
    try:
        Shaping(**given)
    except ValueError as exc:
        raise _flagged(exc) from None
    return given


def reply_limit(args) -> int | None:
    """``-n``: the most tokens a reply has (None, from -1: until the context is full)."""
    if args.max_tokens == -1:
        return None
    if args.max_tokens < 1:
        raise EdgespecError(f"invalid -n {args.max_tokens}: the most tokens a reply has, >= 1 "
                            f"(-1: until the context is full)")
    return args.max_tokens


def shaping(args):
    """What the penalties and the grammar (``--grammar``, ``--grammar-file`` or
    ``--json-schema``) given change in the target's distribution; None: nothing."""
    from ..core.grammar import Grammar, closed
    from ..core.shaping import Shaping
    asked = [(flag, text) for flag, text in (
        ("--grammar", args.grammar),
        ("--grammar-file", None if args.grammar_file is None else read_text(args.grammar_file, "--grammar-file")),
        ("--json-schema", args.json_schema)) if text is not None]
    if len(asked) > 1:
        raise EdgespecError(f"{asked[0][0]} and {asked[1][0]} each constrain the whole reply: use one")
    given, rule = penalties(args), None
    try:
        if asked and asked[0][0] == "--json-schema":
            # llama.cpp's: an object lists all its properties unless the schema says otherwise
            rule = Grammar.json_schema(closed(json_value(asked[0][1])))
        elif asked:
            rule = Grammar.gbnf(asked[0][1])
    except ValueError as exc:
        raise EdgespecError(f"invalid {asked[0][0]}: {str(exc).removeprefix('invalid json_schema: ')}") from None
    result = Shaping(rule=rule, **given)
    return result if result.active else None


def json_value(text: str):
    """``--json-schema``'s JSON, or a clear error."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise EdgespecError(f"--json-schema is not valid JSON ({exc}): give a schema object, "
                            f"e.g. '{{\"type\": \"object\"}}'") from None


def on_accelerator(args) -> bool:
    """Whether the target runs on a GPU: layers offloaded (-ngl, on a build that can), or
    MLX on Apple Silicon."""
    from ..models.arguments import on_apple_silicon, pick_backend
    if pick_backend(args.model, args.backend) == "mlx":
        return on_apple_silicon()
    return args.n_gpu_layers != 0 and _can_offload()


def _can_offload() -> bool:
    from ..backends.llama_lib import gpu_offload_supported
    return gpu_offload_supported()


def build_engine(args, *, fetch: bool = False, disk: bool = True):
    """Load target and drafter as the arguments say and return an Engine.

    Without ``-d`` (and no saved profile): auto mode over prompt lookup. ``disk``: with
    the folder of saved prompts (``--cache-dir``), as chat, generate and serve have it."""
    from ..api import load
    from ..models.arguments import pick_backend
    from ..measure.profiles import load_profile

    o = backend_options(args)
    if args.model_draft is not None:
        if args.draft is not None and args.draft != args.model_draft:
            raise EdgespecError(f"-d {args.draft} and -md {args.model_draft} both name the drafter: "
                                f"give one (with a draft model, auto mode asks prompt lookup too)")
        args.draft = args.model_draft
    if o.n_gpu_layers and pick_backend(args.model, args.backend) == "llama.cpp" and not _can_offload():
        print("(this llama-cpp-python build cannot offload to a GPU, so -ngl runs on the CPU; "
              "docs/gpu.md shows how to rebuild it with CUDA or Metal)", file=sys.stderr)
    if args.draft is None and not args.no_spec:
        profile = load_profile(args.model)
        if profile:  # `edgespec bench --save-profile` measured the best pairing here
            args.draft = profile["draft"]
            if args.num_draft == "auto":  # (a --draft-max given wins)
                args.num_draft = profile["num_draft"]
            print(f"(saved profile: drafter {args.draft}, k={args.num_draft})", file=sys.stderr)
        else:  # prompt lookup costs nothing to ask, and auto mode drafts only where it pays
            args.draft = registry.DEFAULT
    check_drafting(args)
    if args.draft_p_min is not None and not 0 <= args.draft_p_min < 1:
        raise EdgespecError(f"invalid --draft-p-min {args.draft_p_min}: must be 0 <= p < 1")
    return load(args.model, None if args.no_spec else args.draft, args.backend,
                draft_backend=args.draft_backend,
                num_draft=4 if args.no_spec else args.num_draft,  # no drafter at all: plain
                draft_p_min=args.draft_p_min, n_ctx=o.n_ctx,
                n_threads=o.n_threads, n_gpu_layers=o.n_gpu_layers, flash_attn=o.flash_attn,
                draft_n_threads=args.threads_draft, draft_n_gpu_layers=args.n_gpu_layers_draft,
                mlx_quantize=o.mlx_quantize, fetch=fetch, rpc=args.rpc, draft_rpc=args.rpc_draft,
                kernels=o.kernels, cache_ram=args.cache_ram,
                cache_reuse=args.cache_reuse, cache_dir=_cache_dir(args) if disk else None,
                cache_disk=args.cache_disk, n_batch=o.n_batch, n_ubatch=o.n_ubatch,
                type_k=o.type_k, type_v=o.type_v, use_mmap=o.use_mmap,
                chat_template=o.chat_template, draft_min=args.draft_min)


def check_drafting(args) -> None:
    """Refuse drafting options that nothing would read: a drafter with --no-spec, a
    draft length without a drafter, a draft model's settings without a draft model."""
    if args.no_spec and args.draft not in (None, registry.NONE):  # (-d none says the same)
        raise EdgespecError(f"--no-spec decodes plainly, and -d/-md {args.draft} names a drafter: "
                            f"give one of them")
    if (args.no_spec or args.draft == registry.NONE) and (args.num_draft != "auto" or args.draft_min):
        raise EdgespecError("--draft-max and --draft-min set how far a drafter drafts, and "
                            "there is none (--no-spec or -d none): leave them out")
    if args.draft is None or not registry.runs_no_model(args.draft):
        return
    given = [flag for flag, value in (("--draft-p-min", args.draft_p_min), ("-td", args.threads_draft),
                                      ("-ngld", args.n_gpu_layers_draft), ("--rpc-draft", args.rpc_draft),
                                      ("--draft-backend", args.draft_backend)) if value is not None]
    if given:
        raise EdgespecError(f"{', '.join(given)} set{'s' if len(given) == 1 else ''} the draft model, "
                            f"and -d {args.draft} runs none: give -md MODEL, or leave "
                            f"{'it' if len(given) == 1 else 'them'} out")


def _cache_dir(args) -> str | None:
    """``--cache-dir``, else the default folder where it can be made (else none, and why)."""
    if args.cache_dir is not None or args.cache_disk == 0 or (args.cache_disk is None and disk_budget_mib() == 0):
        return args.cache_dir or default_folder()
    folder = default_folder()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if os.access(folder, os.W_OK):
            return str(folder)
        reason = "not writable"
    except OSError as exc:
        reason = exc.strerror or str(exc)
    print(f"(saved prompts stay in RAM only: {folder} cannot be used ({reason}); "
          f"give --cache-dir DIR)", file=sys.stderr)
    return None


def writable(path: str, flag: str) -> str:
    """``path`` if a file can be written there; checked before a long run, not after it."""
    folder = Path(path).expanduser().absolute().parent
    if not folder.is_dir():
        raise EdgespecError(f"cannot write {flag} {path}: the folder {folder} does not exist "
                            f"(create it, or choose another path)")
    if not os.access(folder, os.W_OK):
        raise EdgespecError(f"cannot write {flag} {path}: the folder {folder} is not writable "
                            f"(choose another path)")
    return path
