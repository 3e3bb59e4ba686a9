"""``edgespec chat``: a terminal conversation that streams tokens as they are committed."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from . import flags
from ..drafters import registry
from ..errors import EdgespecError
from ..paths import edgespec_home
from ..session import ChatSession

HELP = """commands:
  /help                 this list
  /reset                forget the conversation (-d suffix still remembers it)
  /reset all            ... and the suffix drafter's memory of earlier ones
  /system TEXT          set the system message (and start over)
  /set NAME VALUE       temp, top_p, top_k, min_p, num_draft (k or auto), max_tokens
  /draft on|off         speculative decoding on or off
  /stats                session totals and acceptance per draft position
  /save FILE            write the transcript (JSON)
  /load FILE            continue a saved transcript
  /quit                 leave (Ctrl-D works too; Ctrl-C stops a reply)"""

_DRAFT_COLOR = "\x1b[36m"  # accepted draft tokens, like LM Studio's highlighting
_DIM = "\x1b[2m"
_RESET = "\x1b[0m"


def _setup_line_editing() -> None:
    """Arrow keys, line editing and a persistent history, through readline."""
    try:
        import readline
    except ImportError:  # Windows without pyreadline: plain input() still works
        return
    history = edgespec_home() / "chat_history"
    try:
        history.parent.mkdir(parents=True, exist_ok=True)
        if history.exists():
            readline.read_history_file(str(history))
        readline.set_history_length(1000)
        import atexit
        atexit.register(readline.write_history_file, str(history))
    except OSError:
        pass


class ProgressLine:
    """A line that shows how far a long prompt's processing has come, and the time left,
    rewritten in place and erased when the reply starts. Shown where at least
    :attr:`MIN_TOKENS` are left to evaluate; before the first pass has ended, the time
    left comes from the rate the last prompt ran at."""

    MIN_TOKENS = 256

    def __init__(self, out):
        self.out, self.shown, self.rate = out, False, None  # rate: tokens per second

    def __call__(self, p) -> None:
        if p.total - p.cache < self.MIN_TOKENS:
            return
        left = p.seconds_left()
        if p.processed > p.cache and p.seconds > 0:
            self.rate = (p.processed - p.cache) / p.seconds
        elif left is None and self.rate:
            left = (p.total - p.processed) / self.rate
        if p.processed >= p.total:
            self.clear()
            return
        eta = f", about {left:.0f} s left" if left is not None else ""
        cached = f" ({p.cache:,} cached)" if p.cache else ""
        self.out.write(f"\r\x1b[K(prompt: {p.processed:,} of {p.total:,} tokens{cached}{eta})")
        self.out.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            self.out.write("\r\x1b[K")
            self.out.flush()
            self.shown = False


def _stats_line(session: ChatSession) -> str:
    turn = session.last
    s = turn.stats
    parts = [f"{s.generated_tokens} tokens", f"{s.tokens_per_second:.1f} tok/s"]
    if s.drafter != registry.NONE:
        parts += [f"acceptance {s.acceptance_rate:.0%}",
                  f"mean accepted length {s.mean_accepted_length:.2f}", f"drafter {s.drafter}"]
    else:
        parts.append("no drafter")
    parts.append(f"prompt eval {s.prompt_eval_tokens}/{s.prompt_tokens} tokens")
    if s.prompt_restored_tokens:
        parts.append(f"{s.prompt_restored_tokens} restored from saved prompts")
    if turn.finish_reason not in ("stop",):
        parts.append(f"finish {turn.finish_reason}")
    if turn.dropped_messages:
        parts.append(f"dropped {turn.dropped_messages} oldest messages to fit the context")
    return "[" + ", ".join(parts) + "]"


def _totals(session: ChatSession) -> str:
    t = session.totals
    lines = [f"session: {t.generated_tokens} tokens generated, {t.rounds} rounds, "
             f"{t.plain_steps} plain steps, drafted {t.drafted}, accepted {t.accepted} "
             f"({t.acceptance_rate:.1%}), mean accepted length {t.mean_accepted_length:.2f}",
             f"time: prefill {t.prefill_time_s:.2f}s, drafting {t.draft_time_s:.2f}s, "
             f"verifying {t.verify_time_s:.2f}s, plain {t.plain_time_s:.2f}s; "
             f"{t.tokens_per_second:.1f} tok/s overall"]
    per = ", ".join(f"{i + 1}: {a:.0%}" for i, a in enumerate(t.acceptance_per_position))
    lines.append(f"acceptance per draft position: {per or 'nothing drafted yet'}")
    return "\n".join(lines)


def _command(session: ChatSession, line: str, out) -> bool:
    """Run a /command; return False when the chat should end."""
    name, _, arg = line[1:].partition(" ")
    arg = arg.strip()
    if name in ("quit", "exit", "q"):
        return False
    if name == "help":
        print(HELP, file=out)
    elif name == "reset":
        if arg not in ("", "all"):
            raise EdgespecError("usage: /reset or /reset all")
        session.reset(forget_memory=arg == "all")
        print("(conversation cleared)" if not arg else "(conversation and drafter memory cleared)",
              file=out)
    elif name == "system":
        session.system = arg or None
        session.reset()
        print("(system message set; conversation cleared)", file=out)
    elif name == "set":
        _set(session, arg, out)
    elif name == "draft":
        if arg not in ("on", "off"):
            raise EdgespecError("usage: /draft on|off")
        if arg == "on" and not session.engine.active_drafters():
            raise EdgespecError("no drafter loaded: restart with -d MODEL or -d lookup")
        session.speculative = arg == "on"
        print(f"(speculative decoding {arg})", file=out)
    elif name == "stats":
        print(_totals(session), file=out)
    elif name == "save":
        if not arg:
            raise EdgespecError("usage: /save FILE")
        print(f"(saved to {session.save(arg)})", file=out)
    elif name == "load":
        if not arg:
            raise EdgespecError("usage: /load FILE")
        print(f"(loaded {session.load(arg)} messages)", file=out)
    else:
        raise EdgespecError(f"unknown command /{name}: type /help for the list")
    return True


def _set(session: ChatSession, arg: str, out) -> None:
    field, _, value = arg.partition(" ")
    value = value.strip()
    if not value:
        raise EdgespecError("usage: /set temp|top_p|top_k|min_p|num_draft|max_tokens VALUE")
    try:
        if field in ("temp", "temperature"):
            session.params = session.params.with_(temperature=float(value))
        elif field in ("top_p", "min_p"):
            session.params = session.params.with_(**{field: float(value)})
        elif field == "top_k":
            session.params = session.params.with_(top_k=int(value))
        elif field == "num_draft":
            from .flags import num_draft_arg
            try:
                k = num_draft_arg(value)
            except Exception as exc:
                raise ValueError(str(exc)) from None
            session.engine.configure(session.engine.drafter, k)
        elif field == "max_tokens":
            n = int(value)
            if n < 1:
                raise ValueError("invalid max_tokens: must be an integer >= 1")
            session.max_tokens = n
        else:
            raise EdgespecError(f"cannot set {field!r}: use temp, top_p, top_k, min_p, "
                                f"num_draft or max_tokens")
    except ValueError as exc:
        raise EdgespecError(str(exc)) from None
    print(f"({field} = {value})", file=out)


def _reply(session: ChatSession, text: str, *, show_draft: bool, color: bool, out) -> None:
    """Stream one reply; Ctrl-C stops it and keeps the partial text."""
    stream = session.send(text)
    try:
        for chunk in stream:
            if not chunk.text:
                continue
            if show_draft and chunk.from_draft and color:
                out.write(f"{_DRAFT_COLOR}{chunk.text}{_RESET}")
            else:
                out.write(chunk.text)
            out.flush()
    except KeyboardInterrupt:
        stream.close()  # caches are rewound; the partial reply stays in the history
        if session.progress is not None:
            session.progress.clear()
        out.write("\n(interrupted)")
    out.write("\n")
    line = _stats_line(session)
    out.write(f"{_DIM}{line}{_RESET}\n" if color else line + "\n")
    out.flush()


def run_chat(args) -> int:
    """The chat loop (arguments from ``edgespec chat``)."""
    from .options import build_engine, on_accelerator, reply_limit, sampling_params, shaping
    from ..models.catalog import defaults

    params, shaped, limit = sampling_params(args), shaping(args), reply_limit(args)
    if args.model is None:
        pairing = defaults()["chat"]
        args.model = pairing["target"]
        if args.draft is None and args.model_draft is None:
            # A draft model a third of the target's size pays where a wide pass costs about
            # one step (a GPU); on a CPU it cannot (each drafted token costs most of what
            # it saves), and prompt lookup, which costs nothing, does better.
            args.draft = pairing["draft"] if on_accelerator(args) else registry.DEFAULT
        args.draft = args.draft or args.model_draft
        note = "" if args.draft != registry.DEFAULT else \
            f"; on a GPU (-ngl 99) it adds the draft model {pairing['draft']}"
        print(f"(default pairing: {args.model} with drafter {args.draft}{note})", file=sys.stderr)
    out = sys.stdout
    color = out.isatty() and not os.environ.get("NO_COLOR")
    print(f"(loading {args.model} ...)", file=sys.stderr)
    engine = build_engine(args, fetch=True)
    session = ChatSession(engine, params=params, system=args.system, max_tokens=limit or engine.n_ctx,
                          speculative=bool(engine.active_drafters()),
                          progress=ProgressLine(out) if out.isatty() else None,
                          stop=tuple(args.stop), shaping=shaped)
    if args.load:
        session.load(args.load)
    _setup_line_editing()
    # Stopped from outside (kill, a closed terminal): leave as /quit does, so the engine
    # closes and the conversation is written to the saved prompts (--cache-dir).
    for name in ("SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), lambda *_: sys.exit(0))
    print(f"edgespec chat — target {engine.target.name}, drafter {engine.drafter_name}, "
          f"k={engine.num_draft}. "
          f"/help for commands, Ctrl-D to quit.", file=out)
    try:
        while True:
            try:
                line = input("> ")
            except EOFError:
                print(file=out)
                break
            except KeyboardInterrupt:
                print(file=out)
                break
            if not line.strip():
                continue
            try:
                if line.startswith("/"):
                    if not _command(session, line.strip(), out):
                        break
                    continue
                _reply(session, line, show_draft=args.show_draft, color=color, out=out)
            except EdgespecError as exc:
                print(f"error: {exc}", file=out)
            except KeyboardInterrupt:  # Ctrl-C during a command (e.g. a calibration)
                print("(interrupted)", file=out)
            except Exception as exc:  # a bug of ours: one line, and the conversation stays
                print(f"error: {type(exc).__name__}: {exc} (the conversation is kept; "
                      f"/save it and please report this)", file=out)
    finally:
        for name in ("SIGTERM", "SIGHUP"):  # (a second signal must not cut the saving short)
            if hasattr(signal, name):
                signal.signal(getattr(signal, name), signal.SIG_IGN)
        engine.close()
    return 0


def add_chat_parser(commands) -> None:
    """Register ``edgespec chat`` on the CLI."""
    p = commands.add_parser("chat", help="chat in the terminal (default pairing without -m)")
    p.add_argument("-n", "--n-predict", "--max-tokens", dest="max_tokens", type=int, default=1024,
                   metavar="N", help="the longest reply, in tokens; -1 = until the context is full")
    p.add_argument("--show-draft", action="store_true",
                   help="colour the tokens that came from accepted drafts")
    p.add_argument("--load", type=Path, default=None,
                   help="continue a saved transcript (default: a new conversation)")
    flags.add_target_options(p, model_required=False)
    for add in (flags.add_drafter_options, flags.add_speculation_options, flags.add_sampling_options,
                flags.add_output_options, flags.add_cache_options):
        add(p)
    p.set_defaults(func=run_chat)
