"""The command line's options in llama.cpp's spelling, in groups: each command takes the
groups it uses (and the defaults of those it does not, for :func:`~.options.build_engine`).

A flag edgespec spelled otherwise before keeps working as an alias (``--ctx``,
``--num-draft``, ``--system``); a llama.cpp flag that would mean something else here
(``--draft N``) is refused with both meanings named, never read another way.
"""

from __future__ import annotations

import argparse
import os

from ..core.shaping import REPEAT_LAST_N
from ..drafters.registry import NONE, drafter_help
from ..models.arguments import BACKENDS


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help, with each option's default where it has one and its help does
    not already say it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "default" in text or default is None or isinstance(default, bool) or default == [] \
                or default is argparse.SUPPRESS or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


def add_target_options(parser: argparse.ArgumentParser, *, model_required: bool = True,
                       model_aliases: tuple[str, ...] = ()) -> None:
    """The target model and its context, as llama.cpp's -m, -c, -t, -ngl, -fa, -b, -ub,
    -ctk, -ctv, --no-mmap and --chat-template."""
    g = parser.add_argument_group("model and context")
    g.add_argument("-m", "--model", *model_aliases, required=model_required,
                   help="target model: a .gguf path, an MLX directory or Hub id, or a name from "
                        "`edgespec models list`" + ("" if model_required else
                                                    " (default: the default pairing's)"))
    g.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="auto: MLX on Apple Silicon, llama.cpp elsewhere")
    g.add_argument("-c", "--ctx-size", "--ctx", dest="ctx", type=int, metavar="N", default=4096,
                   help="context size in tokens")
    g.add_argument("-t", "--threads", type=int, metavar="N", default=None,
                   help="CPU threads (default: the physical cores)")
    g.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", type=int, metavar="N", default=0,
                   help="layers to offload to the GPU (CUDA/Metal builds of llama.cpp)")
    g.add_argument("--rpc", default=None, metavar="HOST:PORT[,...]",
                   help="put the target's layers on these rpc-servers (llama.cpp's RPC backend; "
                        "the draft model stays here); see `edgespec info` (default: none)")
    g.add_argument("-fa", "--flash-attn", choices=("on", "off", "auto"), default="auto",
                   help="flash attention (auto: where llama.cpp supports it)")
    g.add_argument("-b", "--batch-size", dest="n_batch", type=int, metavar="N", default=512,
                   help="llama.cpp: logical batch, the most prompt tokens a pass evaluates")
    g.add_argument("-ub", "--ubatch-size", dest="n_ubatch", type=int, metavar="N", default=None,
                   help="llama.cpp: physical batch (default: as -b)")
    g.add_argument("-ctk", "--cache-type-k", dest="type_k", default=None, metavar="TYPE",
                   help="llama.cpp: K cache type (default: f16; also f32, bf16, q8_0, q4_0, "
                        "q4_1, iq4_nl, q5_0, q5_1)")
    g.add_argument("-ctv", "--cache-type-v", dest="type_v", default=None, metavar="TYPE",
                   help="llama.cpp: V cache type (default: f16; quantized needs flash attention)")
    g.add_argument("--no-mmap", dest="use_mmap", action="store_false",
                   help="llama.cpp: read the model into memory instead of mapping the file")
    g.add_argument("--chat-template", default=None, metavar="NAME|JINJA",
                   help="use this chat template instead of the model's own: chatml, llama3, "
                        "gemma, phi3, zephyr, or a Jinja template (default: the model's)")
    g.add_argument("--chat-template-file", default=None, metavar="FILE",
                   help="the same, read from a Jinja file (default: none)")
    g.add_argument("--kernels", choices=("exact", "fast"), default=None,
                   help="'exact': verify passes that round as one-token steps (llama.cpp on the "
                        "CPU, MLX where a probe at load finds they do), so speculative output is "
                        "plain decoding's token for token (docs/exactness.md); 'fast': the "
                        "fastest (default: $EDGESPEC_KERNELS, else fast)")
    g.add_argument("--mlx-quantize", choices=("4bit", "8bit", "none"), default="4bit",
                   help="MLX: requantize GGUF tensors other than Q4_0/Q4_1/Q8_0 to this")


def add_drafter_options(parser: argparse.ArgumentParser, *, model_only: bool = False) -> None:
    """The drafter: -d (edgespec's: any drafter), -md (llama.cpp's: a draft model), and
    the draft model's own -td, -ngld, --draft-backend and --rpc-draft. ``model_only``:
    a command that takes a draft model alone (verify)."""
    g = parser.add_argument_group("drafter")
    g.add_argument("-d", "--drafter", "--draft", dest="draft", type=drafter_arg, default=None,
                   metavar="MODEL" if model_only else "DRAFTER",
                   help="the draft model to check (path or name; default: the default pairing's)"
                   if model_only else
                   "a draft model (path or name), or one that runs no model: " + drafter_help()
                   + f", or '{NONE}' (plain decoding) (default: lookup, or the profile "
                   "`bench --save-profile` saved; on a GPU without -m, the default pairing's)")
    g.add_argument("-md", "--model-draft", default=None, metavar="MODEL",
                   help="draft model, as llama.cpp names it (the same as -d MODEL; default: none)")
    g.add_argument("--draft-backend", choices=BACKENDS, default=None,
                   help="backend of the draft model (default: as --backend); mixed pairs work")
    g.add_argument("-td", "--threads-draft", type=int, metavar="N", default=None,
                   help="CPU threads of the draft model (default: as -t)")
    g.add_argument("-ngld", "--n-gpu-layers-draft", "--gpu-layers-draft", type=int, metavar="N", default=None,
                   help="layers of the draft model to offload (default: as -ngl)")
    g.add_argument("--rpc-draft", default=None, metavar="HOST:PORT[,...]",
                   help="rpc-server(s) for the draft model's layers (default: this machine)")


def add_speculation_options(parser: argparse.ArgumentParser) -> None:
    """How far to draft: llama.cpp's --draft-max (--draft-n), --draft-min, --draft-p-min."""
    g = parser.add_argument_group("speculative decoding")
    g.add_argument("--draft-max", "--draft-n", "--num-draft", dest="num_draft", type=num_draft_arg,
                   default="auto", metavar="N|auto",
                   help="tokens drafted per round: an integer fixes it; 'auto' chooses the drafter "
                        "and the length each round from measured cost and acceptance")
    g.add_argument("--draft-min", type=non_negative("--draft-min"), metavar="N", default=0,
                   help="a draft shorter than this is not verified (a plain step instead)")
    g.add_argument("--draft-p-min", type=float, metavar="X", default=None,
                   help="the draft model stops below this top probability (default: learned "
                        "from acceptance with --draft-max auto, else 0)")
    g.add_argument("--no-spec", action="store_true", help="plain decoding, no drafter")


def add_sampling_options(parser: argparse.ArgumentParser) -> None:
    """Sampling and penalties, as llama.cpp's (-s, --temp, --top-k, ..., --frequency-penalty)."""
    g = parser.add_argument_group("sampling")
    g.add_argument("-s", "--seed", type=int, metavar="N", default=None,
                   help="reproducible sampling: with a seed the text is the same whatever the "
                        "drafter and k, or speculation off (default and -1: a new seed each time)")
    g.add_argument("--temp", type=float, metavar="X", default=0.8, help="temperature; 0 = greedy")
    g.add_argument("--top-k", type=int, metavar="N", default=0,
                   help="keep the k likeliest tokens; 0 = off (llama.cpp's default: 40)")
    g.add_argument("--top-p", type=float, metavar="X", default=1.0,
                   help="nucleus sampling; 1 = off (llama.cpp's default: 0.95)")
    g.add_argument("--min-p", type=float, metavar="X", default=0.0,
                   help="drop tokens below this share of the likeliest's probability; 0 = off "
                        "(llama.cpp's default: 0.05)")
    g.add_argument("--typical", type=float, metavar="X", default=1.0, help="locally typical sampling; 1 = off")
    g.add_argument("--repeat-penalty", type=float, metavar="X", default=1.0,
                   help="llama.cpp's repetition penalty over the last --repeat-last-n tokens; 1 = off")
    g.add_argument("--repeat-last-n", type=int, metavar="N", default=REPEAT_LAST_N,
                   help="tokens the repetition penalty looks back over; 0 = off, -1 = the context")
    g.add_argument("--presence-penalty", type=float, metavar="X", default=0.0,
                   help="OpenAI's, over the reply's tokens; 0 = off")
    g.add_argument("--frequency-penalty", type=float, metavar="X", default=0.0,
                   help="OpenAI's, over the reply's tokens; 0 = off")
    g.add_argument("--sampling", choices=("exact", "invariant"), default=None,
                   help="invariant: each token decided by noise keyed by the seed and its "
                        "position (the default with --seed); exact: a draft model's own draws "
                        "and the exact acceptance rule (the default without)")


def add_output_options(parser: argparse.ArgumentParser) -> None:
    """The reply's shape: -sys, -r (stop strings), --grammar, --grammar-file, --json-schema."""
    g = parser.add_argument_group("output")
    g.add_argument("-sys", "--system-prompt", "--system", dest="system", default=None, metavar="TEXT",
                   help="system message (default: none)")
    g.add_argument("-r", "--reverse-prompt", dest="stop", action="append", default=[],
                   metavar="TEXT", help="end the reply before this text (may be given again)")
    g.add_argument("--grammar", default=None, metavar="GBNF",
                   help="a GBNF grammar (llama.cpp's) the reply follows (default: none)")
    g.add_argument("--grammar-file", default=None, metavar="FILE",
                   help="the same, read from a file (default: none)")
    g.add_argument("--json-schema", default=None, metavar="SCHEMA",
                   help="a JSON schema the reply's JSON follows (default: none)")


def add_cache_options(parser: argparse.ArgumentParser) -> None:
    """Saved prompts: llama-server's --cache-ram and --cache-reuse, and a folder."""
    g = parser.add_argument_group("saved prompts")
    g.add_argument("--cache-ram", type=int, default=None, metavar="MiB",
                   help="host RAM for saved prompts: a prompt that repeats an earlier "
                        "conversation (a client's next edit after a side request) restores "
                        "its KV state instead of evaluating it (0: off; default: 8192, or a "
                        "quarter of the RAM if less)")
    g.add_argument("--cache-reuse", type=int, default=0, metavar="N",
                   help="move cached chunks of at least N tokens that reappear after a "
                        "divergence into place by KV shift, as llama-server's --cache-reuse "
                        "(llama.cpp only; 0: off, the default). Not exact: the logits after "
                        "a shifted chunk move far beyond rounding (docs/exactness.md); "
                        "exact kernels ignore it")
    g.add_argument("--cache-dir", default=None, metavar="DIR",
                   help="folder for saved prompts that outlive the process: a chat started "
                        "again or a server restarted restores a conversation's prompt instead "
                        "of evaluating it (default: $EDGESPEC_HOME/prompt-cache)")
    g.add_argument("--cache-disk", type=int, default=None, metavar="MiB",
                   help="disk budget of --cache-dir, least recently used states removed past "
                        "it (0: off; default: $EDGESPEC_CACHE_DISK, else 4096)")


def take_defaults(parser: argparse.ArgumentParser, *groups) -> None:
    """Give ``parser`` the defaults of option ``groups`` it does not list (what the
    code that builds an engine reads), without offering the options."""
    scratch = argparse.ArgumentParser(add_help=False)
    for add in groups:
        add(scratch)
    parser.set_defaults(**vars(scratch.parse_args([])))


# -- values ------------------------------------------------------------------------------


def drafter_arg(value: str, flag: str | None = None) -> str:
    """``-d``: a drafter's name or a draft model; a bare number is llama.cpp's --draft N,
    which means something else here, and is refused saying so (as a usage error, or
    with ``flag``, an EdgespecError naming it)."""
    if value.isdigit() and not os.path.exists(value):
        message = (f"{value} is a number: in llama.cpp --draft N is how many tokens to draft, here "
                   f"-d/--draft names the drafter. Give --draft-max {value} to draft {value} tokens "
                   f"a round, and -md FILE for a draft model")
        if flag is None:
            raise argparse.ArgumentTypeError(message)
        from ..errors import EdgespecError
        raise EdgespecError(f"{flag} {message}")
    return value


def num_draft_arg(value: str) -> int | str:
    """``--draft-max``: a positive integer or ``auto``."""
    if value == "auto":
        return value
    try:
        k = int(value)
    except ValueError:
        k = 0
    if k < 1:
        raise argparse.ArgumentTypeError(f"invalid draft length {value!r}: must be 'auto' or an integer >= 1")
    return k


def non_negative(flag: str):
    """An integer >= 0, or a message naming ``flag``."""
    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            n = -1
        if n < 0:
            raise argparse.ArgumentTypeError(f"invalid {flag} {value!r}: must be an integer >= 0")
        return n
    return parse
