"""The wait for the first token after a restart: saved prompts on disk against a cold run.

For conversations of about 1k, 4k and 7k tokens (code files pasted into a chat, built
from edgespec's own sources, and a question), each round:

- ``serve``: a fresh ``edgespec serve`` with an empty ``--cache-dir`` answers the
  conversation; it is stopped (SIGTERM, as a service manager stops it: its states are
  written then) and started again on the same folder; the follow-up (the conversation,
  the answer, another question) is sent, and its time to first token taken. The cold
  run: the same follow-up on a fresh server with ``--cache-disk 0``.
- ``chat``: ``edgespec chat`` loads the conversation (``/load``), is asked its last
  question, saves the transcript and quits; started again, it ``/load``s the transcript
  and is asked the follow-up. The cold run: the same with ``--cache-disk 0``.

The time to first token is taken from the request (the line typed) to the first byte of
the reply; the model's loading is not in it, and is printed apart, as is the time a
stop took (writing the states). Greedy replies of 16 tokens.

    python scripts/bench_resume.py --rounds 2 --json bench-out/resume.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pexpect
from pexpect.popen_spawn import PopenSpawn

sys.path.insert(0, str(Path(__file__).parent))
from bench_sessions import send, start  # noqa: E402
from capture_clients import free_port  # noqa: E402

ROOT = Path(__file__).parent.parent
LAST = "Summarize what these files do, in two sentences."
FOLLOW_UP = "Which function would you test first, and why? One sentence."


def conversation(tokenizer, size: int) -> list[dict]:
    """A chat of about ``size`` tokens: a system message, then code files pasted in turn
    (edgespec's own modules, in a fixed order), each with a short answer, then :data:`LAST`."""
    files = sorted((ROOT / "edgespec" / "core").glob("*.py")) + sorted((ROOT / "edgespec" / "serve").glob("*.py"))
    messages = [{"role": "system", "content": "You are a careful coding assistant."}]
    for path in files:
        code = path.read_text()
        messages += [{"role": "user", "content": f"Here is {path.name}:\n```python\n{code}\n```\nRead it."},
                     {"role": "assistant", "content": f"I have read {path.name}."}]
        if len(tokenizer(messages)) >= size:
            while len(tokenizer(messages)) > size:  # trim the last file to the size
                body = messages[-2]["content"]
                messages[-2]["content"] = body[:int(len(body) * 0.9)] + "\n```\nRead it."
            break
    return messages + [{"role": "user", "content": LAST}]


def serve_case(model: Path, messages: list[dict], args, folder: Path) -> dict:
    """Answer, stop, start again, follow up (and the follow-up on a fresh server, cold)."""
    body = {"messages": messages, "max_tokens": 16, "temperature": 0}
    flags = f"--cache-dir {folder} --cache-disk 4096 {args.edgespec_args}"  # (start() turns it off)
    port = free_port()
    first = start_timed("edgespec", model, port, args, flags)
    answer = send(port, body)
    stop_started = time.perf_counter()
    first["process"].send_signal(signal.SIGTERM)
    first["process"].wait()
    stop_s = time.perf_counter() - stop_started
    follow = messages + [{"role": "assistant", "content": answer["text"]}, {"role": "user", "content": FOLLOW_UP}]
    port = free_port()
    again = start_timed("edgespec", model, port, args, flags)
    restored = send(port, dict(body, messages=follow))
    stop(again["process"])
    port = free_port()
    cold_server = start_timed("edgespec", model, port, args, f"--cache-disk 0 {args.edgespec_args}")
    cold = send(port, dict(body, messages=follow))
    stop(cold_server["process"])
    return {"first_ttft_s": answer["ttft_s"], "stop_s": stop_s, "load_s": again["load_s"],
            "restored_ttft_s": restored["ttft_s"], "restored_evaluated": restored["prompt_evaluated"],
            "cold_ttft_s": cold["ttft_s"], "cold_evaluated": cold["prompt_evaluated"],
            "prompt_tokens": (restored["prompt_evaluated"] or 0) + (restored["prompt_cached"] or 0)}


def start_timed(server: str, model: Path, port: int, args, flags: str) -> dict:
    started = time.perf_counter()
    process = start(server, model, port, argparse.Namespace(**{**vars(args), "edgespec_args": flags}))
    return {"process": process, "load_s": time.perf_counter() - started}


def stop(process) -> None:
    process.send_signal(signal.SIGTERM)
    process.wait()


def chat_case(model: Path, messages: list[dict], args, folder: Path, work: Path) -> dict:
    """/load, ask, /save, quit; start again, /load, follow up (and the same, cold)."""
    first = work / "first.json"
    first.write_text(json.dumps({"version": 1, "system": messages[0]["content"], "messages": messages[1:-1]}))
    saved = work / "saved.json"
    child, load_s = chat(model, args, f"--cache-dir {folder}")
    first_ttft = ask(child, f"/load {first}", LAST)
    child_stats(child)
    child.sendline(f"/save {saved}")
    child.expect_exact("> ")
    stop_started = time.perf_counter()
    child.sendline("/quit")
    child.expect(pexpect.EOF)
    child.wait()
    stop_s = time.perf_counter() - stop_started
    child, load_s = chat(model, args, f"--cache-dir {folder}")
    restored, stats = ask(child, f"/load {saved}", FOLLOW_UP), child_stats(child)
    quit_chat(child)
    child, _ = chat(model, args, "--cache-disk 0")
    cold, cold_stats = ask(child, f"/load {saved}", FOLLOW_UP), child_stats(child)
    quit_chat(child)
    return {"first_ttft_s": first_ttft, "stop_s": stop_s, "load_s": load_s,
            "restored_ttft_s": restored, "restored_evaluated": stats[0], "cold_ttft_s": cold,
            "cold_evaluated": cold_stats[0], "prompt_tokens": stats[1]}


def chat(model: Path, args, flags: str):
    """``edgespec chat`` on pipes (no terminal: no progress line), ready for a line."""
    command = [sys.executable, "-m", "edgespec", "chat", "-m", str(model), "--temp", "0", "-n", "16",
               "--ctx", str(args.ctx), *flags.split(), *args.edgespec_args.split()]
    started = time.perf_counter()
    child = PopenSpawn(command, encoding="utf-8", timeout=1800, env={**os.environ, "NO_COLOR": "1"})
    child.expect_exact("> ")
    return child, time.perf_counter() - started


def ask(child, load: str, question: str) -> float:
    """``/load`` a transcript, then ask: the seconds to the reply's first byte."""
    child.sendline(load)
    child.expect(r"\(loaded \d+ messages\)\s*> ")
    asked = time.perf_counter()
    child.sendline(question)
    child.expect(r"\S")
    return time.perf_counter() - asked


def child_stats(child) -> tuple[int, int]:
    """The turn's prompt tokens evaluated and its prompt's length, from the stats line."""
    child.expect(r"prompt eval (\d+)/(\d+) tokens")
    numbers = int(child.match.group(1)), int(child.match.group(2))
    child.expect_exact("> ")
    return numbers


def quit_chat(child) -> None:
    child.sendline("/quit")
    child.expect(pexpect.EOF)
    child.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--sizes", default="1000,4000,7000")
    parser.add_argument("--surfaces", default="serve,chat")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ctx", type=int, default=8192)
    parser.add_argument("--edgespec-args", default="", help="more flags for edgespec serve and chat")
    parser.add_argument("--logs", default=None)
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.logs:
        Path(args.logs).mkdir(parents=True, exist_ok=True)
    from edgespec.backends.llamacpp import LlamaCppBackend
    from edgespec.core.prompting import chat_prompt_ids
    from edgespec.models.catalog import resolve_model
    model = resolve_model(args.model, fetch=True)
    backend = LlamaCppBackend(model, n_ctx=args.ctx)
    sizes = [int(s) for s in args.sizes.split(",")]
    conversations = {size: conversation(lambda m: chat_prompt_ids(backend, m), size) for size in sizes}
    backend.close()
    results: dict[str, dict[str, list[dict]]] = {}
    for round_ in range(args.rounds):
        for size in sizes:
            for surface in args.surfaces.split(","):
                with tempfile.TemporaryDirectory() as tmp:
                    folder, work = Path(tmp) / "cache", Path(tmp)
                    row = serve_case(model, conversations[size], args, folder) if surface == "serve" \
                        else chat_case(model, conversations[size], args, folder, work)
                results.setdefault(surface, {}).setdefault(str(size), []).append(row)
                print(f"round {round_ + 1} {surface:5} {size:5}: first {row['first_ttft_s']:.1f} s, "
                      f"stop {row['stop_s']:.1f} s, load {row['load_s']:.1f} s; follow-up restored "
                      f"{row['restored_ttft_s']:.2f} s ({row['restored_evaluated']} evaluated of "
                      f"{row['prompt_tokens']}), cold {row['cold_ttft_s']:.1f} s "
                      f"({row['cold_evaluated']} evaluated)", file=sys.stderr, flush=True)
                if args.json:
                    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
                    Path(args.json).write_text(json.dumps({"model": args.model, "results": results}, indent=1))
    report(results)
    return 0


def report(results: dict) -> None:
    """The table docs/benchmarks.md shows: per surface and size, min–max over rounds."""
    def span(rows, key, digits=1):
        values = [r[key] for r in rows]
        return f"{min(values):.{digits}f}–{max(values):.{digits}f}"
    print("| surface | conversation | prompt tokens | first token after a restart, s | cold, s | "
          "evaluated after the restart | × faster | stop (writes), s | model load, s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for surface, by_size in results.items():
        for size, rows in by_size.items():
            speedup = [r["cold_ttft_s"] / r["restored_ttft_s"] for r in rows]
            print(f"| {surface} | ~{int(size) // 1000}k | {rows[0]['prompt_tokens']} | "
                  f"{span(rows, 'restored_ttft_s', 2)} | {span(rows, 'cold_ttft_s')} | "
                  f"{'–'.join(str(v) for v in sorted({r['restored_evaluated'] for r in rows}))} | "
                  f"{min(speedup):.0f}–{max(speedup):.0f} (median {statistics.median(speedup):.0f}) | "
                  f"{span(rows, 'stop_s')} | {span(rows, 'load_s')} |")


if __name__ == "__main__":
    sys.exit(main())
