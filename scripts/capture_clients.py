"""Capture what real clients send to ``edgespec serve``, as request sets for benchmarks.

It starts ``edgespec serve`` and, in front of it, a recording proxy that forwards
every request (streaming included) and keeps the JSON body of each chat request.
Then it drives the clients through the proxy, one job at a time:

- ``aider``: the terminal coding assistant (``pip install aider-chat``, in a
  virtual environment of its own: its pinned dependencies clash with edgespec's),
  in its ``whole`` and ``diff`` edit formats, scripted with ``--message --yes-always
  --no-git --no-show-model-warnings`` on a file of its own;
- ``chat``: a conversation about code in the shape edgespec's chat page sends
  (``{"messages": [...], "stream": true}``, each reply appended before the next turn);
- ``apply``: an editor's "apply this change to the file" request, in the shape of
  Continue's apply prompt (the file, the edited code block, "rewrite the whole file").

Each job's requests become entries of a request set (``edgespec/prompts/client.json``,
the tuning split, and ``client-val.json``, the validation split, written before any
tuning on them): the messages as sent, the sampling fields the client set, and the
conversation it belongs to. The jobs and their files are listed in
``scripts/client_jobs/jobs.json``; the files are real code under permissive licenses
(Python's standard library, PSF; npm packages, MIT), kept as they were published (with
``.txt`` added to their names: they are data here, not the project's code).

    /path/to/aider-venv/bin/pip install aider-chat
    python scripts/capture_clients.py --aider /path/to/aider-venv/bin/aider --split tuning
    python scripts/capture_clients.py --aider /path/to/aider-venv/bin/aider --split validation
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

JOBS = Path(__file__).parent / "client_jobs"
PROMPTS = Path(__file__).parent.parent / "edgespec" / "prompts"
SPLITS = {"tuning": "client", "validation": "client-val"}
SAMPLING = ("temperature", "top_p", "top_k", "min_p", "seed", "max_tokens", "max_completion_tokens", "stop")


class Recorder:
    """The chat requests seen by the proxy, in order."""

    def __init__(self):
        self.bodies: list[dict] = []
        self.lock = threading.Lock()

    def take(self) -> list[dict]:
        with self.lock:
            bodies, self.bodies = self.bodies, []
        return bodies


def proxy(upstream_port: int, recorder: Recorder) -> ThreadingHTTPServer:
    """A proxy on a free port that forwards to ``upstream_port`` and records chat bodies."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def _forward(self, method: str):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            if method == "POST" and self.path.rstrip("/").endswith("/chat/completions") and body:
                with recorder.lock:
                    recorder.bodies.append(json.loads(body))
            connection = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=3600)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
            connection.request(method, self.path, body=body, headers=headers)
            response = connection.getresponse()
            self.send_response(response.status)
            chunked = response.getheader("Transfer-Encoding", "").lower() == "chunked" \
                or response.getheader("Content-Length") is None
            for key, value in response.getheaders():
                if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(key, value)
            if chunked:
                self.send_header("Transfer-Encoding", "chunked")
            else:
                self.send_header("Content-Length", response.getheader("Content-Length"))
            self.send_header("Connection", "close")
            self.end_headers()
            while data := response.read1(65536) if chunked else response.read():
                if chunked:
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                else:
                    self.wfile.write(data)
                self.wfile.flush()
                if not chunked:
                    break
            if chunked:
                self.wfile.write(b"0\r\n\r\n")
            connection.close()
            self.close_connection = True

        def do_GET(self):
            self._forward("GET")

        def do_POST(self):
            self._forward("POST")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, port: int, ctx: int) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-m", "edgespec.cli.main", "serve", "-m", model,
                                "--port", str(port), "--ctx", str(ctx)],
                               stderr=subprocess.PIPE, text=True)
    for line in process.stderr:
        sys.stderr.write(line)
        if "serving" in line:
            threading.Thread(target=lambda: [sys.stderr.write(x) for x in process.stderr],
                             daemon=True).start()
            return process
    raise RuntimeError("edgespec serve did not start")


@contextlib.contextmanager
def recording_server(model: str, ctx: int):
    """``edgespec serve`` behind a recording proxy: yields the proxy's base URL and the
    recorder holding every request body it forwarded; stops both on the way out."""
    port = free_port()
    server = start_server(model, port, ctx)
    recorder = Recorder()
    front = proxy(port, recorder)
    try:
        yield f"http://127.0.0.1:{front.server_address[1]}/v1", recorder
    finally:
        front.shutdown()
        server.terminate()
        server.wait()


def run_aider(aider: str, job: dict, base: str, model: str) -> None:
    """Run aider once on a fresh copy of the job's file."""
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(JOBS / job["file"], Path(tmp) / source_name(job))
        aider_edit(aider, job, job["message"], base, model, tmp)


def run_aider_session(aider: str, job: dict, base: str, model: str) -> None:
    """A user's session with aider: one edit after another on the same file, each
    run restoring the chat history of the ones before (``--restore-chat-history``), so
    aider sends its history summaries as side requests between the edits."""
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(JOBS / job["file"], Path(tmp) / source_name(job))
        for message in job["messages"]:
            aider_edit(aider, job, message, base, model, tmp, "--restore-chat-history")


def aider_edit(aider: str, job: dict, message: str, base: str, model: str, folder: str, *flags: str) -> None:
    """One aider run on the job's file in ``folder``: ``message``, answered and applied."""
    command = [aider, "--model", f"openai/{model}", "--openai-api-base", base,
               "--openai-api-key", "none", "--edit-format", job["format"],
               "--message", message, "--yes-always", "--no-git", *flags,
               "--no-show-model-warnings", "--no-check-update", "--analytics-disable",
               "--no-auto-lint", "--no-auto-test", "--no-pretty", "--no-fancy-input",
               "--map-tokens", "0", source_name(job)]
    env = dict(os.environ, AIDER_CHECK_UPDATE="false")
    result = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True,
                            stdin=subprocess.DEVNULL, timeout=3600)
    sys.stderr.write(result.stdout[-1500:] + result.stderr[-1500:])


def run_chats(job: dict, base: str) -> None:
    """Two conversations on the chat page, their turns alternating (a user switching
    between tabs): the page sends each one's whole history, streamed."""
    histories: list[list[dict]] = [[] for _ in job["conversations"]]
    for turn in range(max(len(c["turns"]) for c in job["conversations"])):
        for conversation, messages in zip(job["conversations"], histories):
            if turn < len(conversation["turns"]):
                text = conversation["turns"][turn]
                content = text.replace("{file}", (JOBS / conversation["file"]).read_text())
                messages.append({"role": "user", "content": content})
                messages.append({"role": "assistant", "content": stream_reply(base, messages)})


def stream_reply(base: str, messages: list[dict], **fields) -> str:
    """Send a chat request as the page does (streamed) and return the reply's text."""
    reply = []
    with httpx.stream("POST", f"{base}/chat/completions", json={"messages": messages, "stream": True, **fields},
                      timeout=3600) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                choices = json.loads(line[6:])["choices"]
                if choices:
                    reply.append(choices[0]["delta"].get("content") or "")
    return "".join(reply)


def source_name(job: dict) -> str:
    """The name of a job's file as the client sees it (stored with ``.txt`` added)."""
    return Path(job["file"]).name.removesuffix(".txt")


def run_chat(job: dict, base: str) -> None:
    """A conversation as edgespec's chat page sends it: the history, streamed."""
    messages = []
    for turn in job["turns"]:
        content = turn.replace("{file}", (JOBS / job["file"]).read_text()) if "file" in job else turn
        messages.append({"role": "user", "content": content})
        messages.append({"role": "assistant", "content": stream_reply(base, messages)})


APPLY_SYSTEM = ("You apply code changes to files. You are given a file and a code block that "
                "shows a change to it, possibly with parts left out. Reply with one code block "
                "holding the whole file with the change applied, and nothing else. Keep every "
                "line the change does not touch exactly as it was.")


def run_apply(job: dict, base: str) -> None:
    """An editor's apply request: the file and the change, "rewrite the whole file";
    with ``then``, a second change applied to the file the first one gave (its reply),
    and with ``predict``, each request sends the file as its Predicted Output."""
    path, name = JOBS / job["file"], source_name(job)
    language = {".py": "python", ".js": "javascript"}.get(Path(name).suffix, "")
    text = path.read_text()
    for change in [job["change"], *job.get("then", [])]:
        user = (f"This is the file {name}:\n\n```{language}\n{text}```\n\n"
                f"Apply this change to it:\n\n```{language}\n{change}\n```\n\n"
                f"Reply with the whole updated file.")
        messages = [{"role": "system", "content": APPLY_SYSTEM}, {"role": "user", "content": user}]
        fields = {"temperature": 0}
        if job.get("predict"):
            fields["prediction"] = {"type": "content", "content": f"```{language}\n{text}```"}
        reply = stream_reply(base, messages, **fields)
        block = reply.split("```")
        text = block[1].split("\n", 1)[1] if len(block) >= 3 and "\n" in block[1] else text


SESSION_SPLITS = {"tuning": "sessions", "validation": "sessions-val"}


def capture_sessions(args) -> int:
    """Each session job's requests, the exact bodies in the order the server got them
    (side requests included), as one entry of ``edgespec/prompts/sessions*.json``."""
    jobs = [j for j in json.loads((JOBS / "sessions.json").read_text()) if j["split"] == args.split]
    if args.only:
        jobs = [j for j in jobs if j["name"] in args.only.split(",")]
    out = args.out or PROMPTS / f"{SESSION_SPLITS[args.split]}.json"
    sessions = json.loads(out.read_text()) if out.exists() else []
    sessions = [e for e in sessions if e["session"] not in {j["name"] for j in jobs}]
    with recording_server(args.model, args.ctx) as (base, recorder):
        runs = {"aider-session": lambda job: run_aider_session(args.aider, job, base, args.model),
                "chats": lambda job: run_chats(job, base), "apply": lambda job: run_apply(job, base)}
        for job in jobs:
            start = time.time()
            runs[job["client"]](job)
            bodies = recorder.take()
            print(f"{job['name']}: {len(bodies)} requests in {time.time() - start:.0f} s", file=sys.stderr)
            sessions.append({"session": job["name"], "client": job["client"]
                             + (f"-{job['format']}" if "format" in job else ""), "requests": bodies})
            out.write_text(json.dumps(sessions, indent=1, ensure_ascii=False) + "\n")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", choices=SPLITS, required=True)
    parser.add_argument("--aider", default="aider", help="the aider command (from its own venv)")
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--ctx", type=int, default=8192)
    parser.add_argument("--only", default="", help="comma-separated job names (default: all)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--sessions", action="store_true",
                        help="capture whole sessions (client_jobs/sessions.json), their exact "
                             "request bodies in order, for scripts/bench_sessions.py")
    args = parser.parse_args()
    if args.sessions:
        return capture_sessions(args)

    jobs = [j for j in json.loads((JOBS / "jobs.json").read_text()) if j["split"] == args.split]
    if args.only:
        jobs = [j for j in jobs if j["name"] in args.only.split(",")]
    out = args.out or PROMPTS / f"{SPLITS[args.split]}.json"
    entries = json.loads(out.read_text()) if out.exists() and args.only else []
    entries = [e for e in entries if e["job"] not in {j["name"] for j in jobs}]
    with recording_server(args.model, args.ctx) as (base, recorder):
        for job in jobs:
            start = time.time()
            if job["client"] == "aider":
                run_aider(args.aider, job, base, args.model)
            elif job["client"] == "chat":
                run_chat(job, base)
            else:
                run_apply(job, base)
            # aider summarises the chat in the background after a reply and exits before
            # that request is answered: the edit requests are the job's.
            bodies = [b for b in recorder.take()
                      if not b["messages"][0]["content"].startswith("*Briefly* summarize")]
            print(f"{job['name']}: {len(bodies)} requests in {time.time() - start:.0f} s", file=sys.stderr)
            for turn, body in enumerate(bodies, 1):
                entries.append({"job": job["name"], "client": f"{job['client']}"
                                + (f"-{job['format']}" if "format" in job else ""),
                                "turn": turn, "messages": body["messages"],
                                "params": {k: body[k] for k in SAMPLING if k in body}})
            out.write_text(json.dumps(entries, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
