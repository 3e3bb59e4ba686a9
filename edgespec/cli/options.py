"""The options every command that runs models shares, and the engine they describe."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..core.prompt_disk import default_budget_mib as disk_budget_mib
from ..core.prompt_disk import default_folder
from ..errors import EdgespecError
from ..drafters import registry
from ..drafters.registry import drafter_help
from ..models.loading import BACKENDS, BackendOptions


def add_model_options(parser: argparse.ArgumentParser, *, model_required: bool = True) -> None:
    """The options shared by every command that runs models (llama.cpp names)."""
    parser.add_argument("-m", "--model", required=model_required,
                        help="target model: a .gguf path, an MLX directory or Hub id, "
                             "or a name from `edgespec models list`")
    parser.add_argument("-d", "--draft", default=None,
                        help="drafter: a draft model (path or name), or one that runs no model: "
                             + drafter_help())
    parser.add_argument("--backend", choices=BACKENDS, default="auto",
                        help="auto: MLX on Apple Silicon, llama.cpp elsewhere")
    parser.add_argument("--draft-backend", choices=BACKENDS, default=None,
                        help="backend of the draft model (default: as --backend); mixed pairs work")
    parser.add_argument("--temp", type=float, default=0.8, help="temperature; 0 = greedy")
    parser.add_argument("--top-k", type=int, default=0, help="0 = off")
    parser.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    parser.add_argument("--min-p", type=float, default=0.0, help="0 = off")
    parser.add_argument("--seed", type=int, default=None,
                        help="reproducible sampling: with a seed the text is the same whatever the "
                             "drafter and k, or speculation off (--sampling)")
    parser.add_argument("--sampling", choices=("exact", "invariant"), default=None,
                        help="invariant: each token decided by noise keyed by the seed and its "
                             "position (the default with --seed); exact: a draft model's own draws "
                             "and the exact acceptance rule (the default without; a draft model's "
                             "tokens are accepted a little more often)")
    parser.add_argument("--num-draft", type=num_draft_arg, default="auto",
                        help="tokens drafted per round (k), or 'auto' (default): choose the "
                             "drafter and k each round from measured cost and acceptance")
    parser.add_argument("--draft-p-min", type=float, default=None,
                        help="the draft model stops below this top probability (default: "
                             "learned from acceptance with --num-draft auto, else 0)")
    parser.add_argument("--no-spec", action="store_true", help="plain decoding, no drafter")
    parser.add_argument("-ngl", "--n-gpu-layers", type=int, default=0,
                        help="layers to offload to the GPU (CUDA/Metal builds of llama.cpp)")
    parser.add_argument("-ngld", "--n-gpu-layers-draft", type=int, default=None,
                        help="the same for the draft model (default: as -ngl)")
    add_rpc_option(parser)
    parser.add_argument("--rpc-draft", default=None, metavar="HOST:PORT[,...]",
                        help="rpc-server(s) for the draft model's layers (default: this machine)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads (default: physical cores)")
    parser.add_argument("-td", "--threads-draft", type=int, default=None,
                        help="CPU threads of the draft model (default: as --threads)")
    parser.add_argument("--ctx", type=int, default=4096, help="context size in tokens")
    parser.add_argument("--cache-ram", type=int, default=None, metavar="MiB",
                        help="host RAM for saved prompts: a prompt that repeats an earlier "
                             "conversation (a client's next edit after a side request) restores "
                             "its KV state instead of evaluating it (0: off; default: 8192, or a "
                             "quarter of the RAM if less)")
    parser.add_argument("--cache-reuse", type=int, default=0, metavar="N",
                        help="move cached chunks of at least N tokens that reappear after a "
                             "divergence into place by KV shift, as llama-server's --cache-reuse "
                             "(llama.cpp only; 0: off, the default). Not exact: the logits after "
                             "a shifted chunk move far beyond rounding (docs/exactness.md); "
                             "exact kernels ignore it")
    parser.add_argument("--cache-dir", default=None, metavar="DIR",
                        help="folder for saved prompts that outlive the process: a chat started "
                             "again or a server restarted restores a conversation's prompt instead "
                             "of evaluating it (default: $EDGESPEC_HOME/prompt-cache)")
    parser.add_argument("--cache-disk", type=int, default=None, metavar="MiB",
                        help="disk budget of --cache-dir, least recently used states removed past "
                             "it (0: off; default: $EDGESPEC_CACHE_DISK, else 4096)")
    parser.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--kernels", choices=("exact", "fast"), default=None,
                        help="'exact': verify passes that round as one-token steps (llama.cpp "
                             "on the CPU, MLX where a probe at load finds they do), so "
                             "speculative output is plain decoding's token for token "
                             "(docs/exactness.md); 'fast' the fastest (default: "
                             "$EDGESPEC_KERNELS, else fast)")
    parser.add_argument("--mlx-quantize", choices=("4bit", "8bit", "none"), default="4bit",
                        help="MLX: requantize GGUF tensors other than Q4_0/Q4_1/Q8_0 to this")


def add_rpc_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rpc", default=None, metavar="HOST:PORT[,...]",
                        help="put the target's layers on these rpc-servers (llama.cpp's RPC "
                             "backend; the draft model stays here); see `edgespec info`")


def num_draft_arg(value: str) -> int | str:
    """``--num-draft``: a positive integer or ``auto``."""
    if value == "auto":
        return value
    try:
        k = int(value)
    except ValueError:
        k = 0
    if k < 1:
        raise argparse.ArgumentTypeError(f"invalid --num-draft {value!r}: must be 'auto' or an integer >= 1")
    return k


def backend_options(args) -> BackendOptions:
    """The backend options given on the command line."""
    return BackendOptions(backend=args.backend, n_ctx=args.ctx, n_threads=args.threads,
                          n_gpu_layers=args.n_gpu_layers,
                          flash_attn={"auto": None, "on": True, "off": False}[args.flash_attn],
                          mlx_quantize=args.mlx_quantize, kernels=args.kernels)


def sampling_params(args):
    """The sampling options given on the command line, validated."""
    from ..core.sampling import SamplingParams
    try:
        return SamplingParams(temperature=args.temp, top_k=args.top_k, top_p=args.top_p,
                              min_p=args.min_p, seed=args.seed,
                              invariant=None if args.sampling is None else args.sampling == "invariant")
    except ValueError as exc:
        raise EdgespecError(f"{exc}") from None


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
    if o.n_gpu_layers and pick_backend(args.model, args.backend) == "llama.cpp" and not _can_offload():
        print("(this llama-cpp-python build cannot offload to a GPU, so -ngl runs on the CPU; "
              "docs/gpu.md shows how to rebuild it with CUDA or Metal)", file=sys.stderr)
    if args.draft is None and not args.no_spec:
        profile = load_profile(args.model)
        if profile:  # `edgespec bench --save-profile` measured the best pairing here
            args.draft, args.num_draft = profile["draft"], profile["num_draft"]
            print(f"(saved profile: drafter {args.draft}, k={args.num_draft})", file=sys.stderr)
        else:  # prompt lookup costs nothing to ask, and auto mode drafts only where it pays
            args.draft = registry.DEFAULT
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
                cache_disk=args.cache_disk)


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
