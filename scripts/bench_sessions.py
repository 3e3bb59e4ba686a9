"""How long a user waits over whole client sessions: edgespec serve vs llama-server.

Replays captured sessions (``edgespec/prompts/sessions.json``, the tuning split, and
``sessions-val.json``, the validation split, written by ``scripts/capture_clients.py
--sessions`` before any tuning): each request's exact body, in order, to a fresh
server, streamed. The servers, in an order that alternates from round to round:

- ``edgespec``: ``edgespec serve`` with its defaults;
- ``llama``: llama-server with its defaults;
- ``llama-spec``: llama-server ``--spec-default``;
- ``llama-ngram``: llama-server ``--spec-type ngram-map-k --cache-reuse 256``.

Every request is greedy (``temperature: 0``; ``--sampled`` sends the bodies as captured,
where the chats leave the temperature to each server's default and its own samplers).

llama-server is built from the llama.cpp that llama-cpp-python vendors
(``scripts/llamacpp_reference.py``), and both load the same GGUF file. Per request:
wall time, time to first token, prompt tokens evaluated and cached (both servers
report them in ``timings``), decode tok/s. Per session: the total. The summary is
edgespec's session time over the best llama-server setting's, per session and as a
geometric mean, min–max over the rounds.

    python scripts/bench_sessions.py --split validation --rounds 2 --json bench-out/sessions.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from capture_clients import free_port  # noqa: E402
from llamacpp_reference import build_llama_server  # noqa: E402

PROMPTS = Path(__file__).parent.parent / "edgespec" / "prompts"
SPLITS = {"tuning": "sessions", "validation": "sessions-val"}
LLAMA_SERVERS = {"llama": [], "llama-spec": ["--spec-default"],
                 "llama-ngram": ["--spec-type", "ngram-map-k", "--cache-reuse", "256"]}


def start(server: str, model: Path, port: int, args) -> subprocess.Popen:
    """A fresh server on ``port``, ready (its /health answers 200)."""
    if server == "edgespec":
        # No saved prompts on disk: a replay starts cold, as llama-server does (a flag in
        # --edgespec-args comes later and wins).
        command = [sys.executable, "-m", "edgespec", "serve", "-m", str(model), "--port", str(port),
                   "--ctx", str(args.ctx), "--cache-disk", "0", *args.edgespec_args.split()]
    else:
        command = [str(args.llama_server), "-m", str(model), "--port", str(port), "-c", str(args.ctx),
                   "-t", str(args.threads), "--no-webui", *LLAMA_SERVERS[server]]
    log = open(Path(args.logs) / f"{server}-{port}.log", "w") if args.logs else subprocess.DEVNULL
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 600
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{server} exited with {process.returncode}: {' '.join(command)}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    process.kill()
    raise RuntimeError(f"{server} did not start in 10 minutes")


def send(port: int, body: dict) -> dict:
    """One request, streamed; what the user waited for and what the server says it did."""
    body = dict(body, stream=True)
    start = time.perf_counter()
    first, timings, text = None, {}, []
    with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body,
                      timeout=3600) as response:
        if response.status_code != 200:
            response.read()
            raise RuntimeError(f"{response.status_code}: {response.text[:300]}")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            for choice in data.get("choices") or []:
                delta = choice.get("delta") or {}
                if first is None and (delta.get("content") or delta.get("tool_calls")):
                    first = time.perf_counter()
                text.append(delta.get("content") or "")
            timings = data.get("timings") or timings
    wall = time.perf_counter() - start
    return {"wall_s": wall, "ttft_s": (first or time.perf_counter()) - start,
            "prompt_evaluated": timings.get("prompt_n"), "prompt_cached": timings.get("cache_n"),
            "decode_tok_s": timings.get("predicted_per_second"), "reply_tokens": timings.get("predicted_n"),
            "reply_chars": len("".join(text)), "text": "".join(text)}


def replay(server: str, session: dict, model: Path, args) -> list[dict]:
    """The session's requests, in order, on a fresh ``server``, each answer fed back
    as the client would (:func:`with_replies`)."""
    port = free_port()
    process = start(server, model, port, args)
    try:
        rows, replies = [], []
        for body in session["requests"]:
            if not args.sampled:  # like for like: greedy on both (a chat client leaves T to the server)
                body = {**body, "temperature": 0}
            rows.append(send(port, with_replies(body, session["requests"], replies)))
            replies.append(rows[-1].pop("text"))
        return rows
    finally:
        process.terminate()
        process.wait()


def with_replies(body: dict, bodies: list[dict], replies: list[str]) -> dict:
    """``body`` as the client sends it to this server: where it continues an earlier
    request (that request's messages, then an assistant message: its answer), the answer
    is the one this server gave, not the one captured. At T = 0 servers (and runs of one
    server) still split at near-ties, and a client sends back what it got; a replay that
    sent another answer would make every server evaluate the follow-up's prompt again."""
    messages = body["messages"]
    for earlier, reply in zip(bodies, replies):
        n = len(earlier["messages"])
        if len(messages) > n and messages[:n] == earlier["messages"] and messages[n]["role"] == "assistant" \
                and isinstance(messages[n].get("content"), str):
            messages = messages[:n] + [dict(messages[n], content=reply)] + messages[n + 1:]
    return dict(body, messages=messages)


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", choices=SPLITS, default="validation")
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--servers", default="edgespec,llama,llama-spec,llama-ngram")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", default="", help="comma-separated session names")
    parser.add_argument("--requests", type=int, default=0, help="replay only the first N of each")
    parser.add_argument("--ctx", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--edgespec-args", default="", help="more flags for edgespec serve")
    parser.add_argument("--sampled", action="store_true",
                        help="send the bodies as captured (the chats sample at each server's default "
                             "temperature, with its own sampler chain); by default every request is "
                             "greedy (temperature 0), so both servers are asked the same")
    parser.add_argument("--logs", default=None, help="a folder for the servers' logs")
    parser.add_argument("--json")
    parser.add_argument("--report", nargs="+", metavar="JSON",
                        help="report earlier runs' --json files together (their rounds merged) and exit")
    args = parser.parse_args()
    if args.report:
        return report_files(args.report)

    from edgespec.models.catalog import resolve_model
    model = resolve_model(args.model, fetch=True)
    servers = args.servers.split(",")
    if any(s != "edgespec" for s in servers):
        args.llama_server = build_llama_server(log=lambda m: print(m, file=sys.stderr))
    sessions = json.loads((PROMPTS / f"{SPLITS[args.split]}.json").read_text())
    if args.only:
        by_name = {s["session"]: s for s in sessions}  # (in the order given)
        sessions = [by_name[name] for name in args.only.split(",") if name in by_name]
    if args.requests:
        sessions = [dict(s, requests=s["requests"][:args.requests]) for s in sessions]
    if args.logs:
        Path(args.logs).mkdir(parents=True, exist_ok=True)

    results: dict[str, dict[str, list[list[dict]]]] = {}
    for round_ in range(args.rounds):
        order = servers if round_ % 2 == 0 else servers[::-1]
        for session in sessions:
            for server in order:
                rows = replay(server, session, model, args)
                results.setdefault(session["session"], {}).setdefault(server, []).append(rows)
                total = sum(r["wall_s"] for r in rows)
                print(f"round {round_ + 1} {session['session']:28} {server:12} {total:7.1f} s  "
                      + " ".join(f"{r['wall_s']:.1f}({r['prompt_evaluated']}/{r['prompt_cached']})"
                                 for r in rows), file=sys.stderr, flush=True)
                if args.json:  # after every replay: a run cut short keeps what it measured
                    Path(args.json).write_text(json.dumps({"split": args.split, "model": args.model,
                                                           "servers": servers, "results": results}, indent=1))
    report(results, servers, sessions)
    return 0


def report_files(paths: list[str]) -> int:
    """The report of several runs (``--json`` files of one split), their rounds merged:
    e.g. a first run of every server, and a second of edgespec and the best."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    results: dict[str, dict[str, list]] = {}
    servers: list[str] = []
    for run in runs:
        servers += [s for s in run["servers"] if s not in servers]
        for name, by_server in run["results"].items():
            for server, rounds in by_server.items():
                results.setdefault(name, {}).setdefault(server, []).extend(rounds)
    sessions = json.loads((PROMPTS / f"{SPLITS[runs[0]['split']]}.json").read_text())
    report(results, servers, sessions)
    return 0


def like_for_like(results: dict) -> dict:
    """Each request's time with its decode scaled to one reply length for every server.

    At T = 0 two servers can still split at a near-tie (a batched pass and a one-token
    pass round differently) and write replies of very different lengths: a history
    summary of 53 tokens on one, 1,197 on the other. The user's wait then measures the
    reply, not the server. So each request's decode time (wall minus time to first
    token) is scaled to the shortest reply to that request over every server and
    round: ``ttft + decode * shortest / reply_tokens``. The raw walls are reported too.
    """
    out = {}
    for name, by_server in results.items():
        n = len(next(iter(by_server.values()))[0])
        # The shortest: scaling a decode down interpolates its per-token time, up would extrapolate.
        shortest = [min(rows[i]["reply_tokens"] or 1 for runs in by_server.values() for rows in runs)
                    for i in range(n)]
        out[name] = {server: [[r["ttft_s"] + (r["wall_s"] - r["ttft_s"]) * shortest[i] / (r["reply_tokens"] or 1)
                               for i, r in enumerate(rows)] for rows in runs]
                     for server, runs in by_server.items()}
    return out


def follow_ups(session: dict) -> list[int]:
    """The requests that go back to a conversation after a request of another one (a side
    request, or the other tab): an earlier request's messages, other than the one
    just before's, begin this one's (the A2 of A1, S, A2)."""
    bodies = [body["messages"] for body in session["requests"]]
    return [i for i in range(2, len(bodies))
            if bodies[i][:len(bodies[i - 1])] != bodies[i - 1]
            and any(bodies[i][:len(b)] == b for b in bodies[:i - 1])]


def report(results: dict, servers: list[str], sessions: list[dict]) -> None:
    """Per session: each server's total (mean, min–max over rounds), like for like (see
    :func:`like_for_like`) and raw; edgespec over the best llama-server setting; then
    per request, edgespec over that setting, and how much of each follow-up's prompt
    was evaluated."""
    llamas = [s for s in servers if s != "edgespec"]
    scaled = like_for_like(results)
    print("Session time, seconds, mean (min–max over rounds), decode scaled to one reply length "
          "per request; raw wall in brackets")
    print("| session | " + " | ".join(servers) + " | edgespec / best llama-server |")
    print("|---" * (len(servers) + 2) + "|")
    ratios, worst, follow = [], [], []
    for session in sessions:
        name = session["session"]
        if name not in results:
            continue
        totals = {s: [sum(rows) for rows in runs] for s, runs in scaled[name].items()}
        raw = {s: [sum(r["wall_s"] for r in rows) for rows in runs] for s, runs in results[name].items()}
        cells = [f"{mean(totals[s]):.1f} ({min(totals[s]):.1f}–{max(totals[s]):.1f}) "
                 f"[{mean(raw[s]):.1f}]" if s in totals else "–" for s in servers]
        ratio = ""
        present = [s for s in llamas if s in totals]
        if "edgespec" in totals and present:
            best = min(present, key=lambda s: mean(totals[s]))
            per_round = [e / b for e, b in zip(totals["edgespec"], totals[best])]
            ratios.append(mean(totals["edgespec"]) / mean(totals[best]))
            ratio = f"{ratios[-1]:.2f} ({min(per_round):.2f}–{max(per_round):.2f}) vs {best}"
            runs_e, runs_b = scaled[name]["edgespec"], scaled[name][best]
            for i in range(len(runs_e[0])):
                e = sum(rows[i] for rows in runs_e) / len(runs_e)
                b = sum(rows[i] for rows in runs_b) / len(runs_b)
                worst.append((e / b, name, i + 1, best))
        for i in follow_ups(session):
            for server in results[name]:
                for rows in results[name][server]:
                    r = rows[i]
                    follow.append((server, name, i + 1, r["prompt_evaluated"],
                                   (r["prompt_evaluated"] or 0) + (r["prompt_cached"] or 0)))
        print(f"| {name} | " + " | ".join(cells) + f" | {ratio} |")
    if ratios:
        print(f"\ngeometric mean, edgespec / best llama-server: {geomean(ratios):.2f}; "
              f"worst session {max(ratios):.2f}")
    print("\ntime per reply token (decode: wall minus time to first token, over the session's reply "
          "tokens), ms, mean (min–max over rounds); time to first token over the session, s:")
    for session in sessions:
        name = session["session"]
        if name not in results:
            continue
        cells = []
        for server in servers:
            runs = results[name].get(server)
            if not runs:
                continue
            per_token = [1000 * sum(r["wall_s"] - r["ttft_s"] for r in rows) /
                         max(1, sum(r["reply_tokens"] or 0 for r in rows)) for rows in runs]
            waits = [sum(r["ttft_s"] for r in rows) for rows in runs]
            cells.append(f"{server} {mean(per_token):.1f} ({min(per_token):.1f}–{max(per_token):.1f}) ms, "
                         f"first tokens {mean(waits):.1f} s")
        print(f"  {name}: " + "; ".join(cells))
    if worst:
        worst.sort(reverse=True)
        print("slowest requests, edgespec / the session's best llama-server (mean over rounds): "
              + ", ".join(f"{n} #{i} {r:.2f} vs {b}" for r, n, i, b in worst[:5]))
    back = [(r, n, i, b) for r, n, i, b in worst
            if i - 1 in follow_ups(next(s for s in sessions if s["session"] == n))]
    if back:
        print("follow-ups after another conversation's request, edgespec / the session's best "
              "llama-server (mean over rounds): " + ", ".join(f"{n} #{i} {r:.2f} vs {b}" for r, n, i, b in back))
    if follow:
        print("\nfollow-ups (back to a conversation after another's request), prompt evaluated / total:")
        for server in servers:
            rows = [f for f in follow if f[0] == server]
            if not rows:
                continue
            print(f"  {server:12} " + ", ".join(f"{n} #{i} {e}/{t} ({e / t:.1%})" for _, n, i, e, t in rows
                                               if t))


if __name__ == "__main__":
    sys.exit(main())
