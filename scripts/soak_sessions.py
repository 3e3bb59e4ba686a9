"""Does the server's memory stay within its budget? A soak on loopback.

Starts ``edgespec serve`` with a draft model and a small ``--cache-ram`` (the one budget
for everything a conversation leaves behind: saved prompt states, the copy indexes, the
suffix drafter's counts) and sends 600+ requests over six conversations that alternate,
each followed now and then by a side request (a summary of it, as aider sends), so that
states and indexes are made, restored and evicted all along. Requests alternate between
the draft model and prompt lookup; every tenth asks for JSON (a grammar) and every tenth
calls a tool. It reads the server's resident memory (``/proc/PID/status`` VmRSS) after
every request, and ``/metrics`` for what each part holds.

The bars: the largest RSS stays within the models and the runtime plus the budget plus
10% of it, and RSS is flat over the last half of the run (a least-squares slope under
1 MiB per 100 requests). The models and the runtime are measured after a warm-up that
sends every kind of request once (the first ten: both drafters, a side request, JSON, a
tool call, each of which sets up something once, such as the grammar engine's view of
the vocabulary), the first of them a prompt that fills most of the context (the KV
caches' and compute buffers' pages are touched as positions and batches first reach
them): its RSS less what the budget's parts held then.

    python scripts/soak_sessions.py --requests 600 --json bench-out/soak.json
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from capture_clients import free_port  # (scripts/, on the path when run as a script)

TOPICS = ["a function that parses dates", "a class for a bank account", "a CSV reader",
          "a retry decorator with backoff", "a binary search tree", "a rate limiter"]
TOOLS = [{"type": "function", "function": {
    "name": "run_tests", "description": "Run the project's tests",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                   "required": ["path"]}}}]


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def memory_parts(text: str) -> dict[str, float]:
    """``edgespec:memory_bytes{part=...}`` in MiB."""
    return {part: round(float(value) / 2**20, 2) for part, value in
            re.findall(r'^edgespec:memory_bytes\{part="([^"]+)"\} (\S+)$', text, re.M)}


def slope_per_100(values: list[float]) -> float:
    """Least-squares slope of ``values`` against their index, per 100 of them."""
    n = len(values)
    mean_x, mean_y = (n - 1) / 2, sum(values) / n
    num = sum((i - mean_x) * (v - mean_y) for i, v in enumerate(values))
    den = sum((i - mean_x) ** 2 for i in range(n))
    return 100 * num / den if den else 0.0


def draft_for(model: str, folder: Path) -> str:
    """The model requantized to Q2_K: a real, cheaper draft model with its vocabulary."""
    from edgespec.models.catalog import resolve_model
    from edgespec.models.quantize import quantize_gguf
    return str(quantize_gguf(resolve_model(model, fetch=True), folder / "draft-q2_k.gguf", "Q2_K"))


def request(i: int, rng: random.Random, conversation: list[dict]) -> tuple[dict, bool]:
    """The i-th request's body, and whether its reply continues the conversation."""
    drafter = "model" if i % 2 or i == 0 else "lookup"  # (the first fills both models' caches)
    body = {"max_tokens": ARGS.max_tokens, "temperature": 0,
            "speculative": {"drafter": drafter, "num_draft": "auto"}}
    if i == 0:  # most of the context (about 15 tokens a line here)
        return dict(body, messages=[{"role": "user", "content": " ".join(
            f"line {n}: value = compute({n}, cache)" for n in range(ARGS.ctx // 20))}]), False
    if rng.random() < 0.3:  # a side request: another prompt, made of the conversation's text
        return dict(body, messages=[
            {"role": "system", "content": "Summarize this conversation in one line."},
            {"role": "user", "content": "\n".join(m["content"] for m in conversation)[-3000:]}]), False
    if i % 10 == 3:
        return dict(body, messages=conversation, response_format={"type": "json_object"}), False
    if i % 10 == 8:
        return dict(body, messages=conversation, tools=TOOLS, tool_choice="required"), False
    return dict(body, messages=conversation), True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct",
                        help="the target (its chat template must have tools)")
    parser.add_argument("--draft", help="the draft model (default: the model requantized to Q2_K)")
    parser.add_argument("--cache-ram", type=int, default=64, help="the budget, MiB")
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--conversations", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--warm-up", type=int, default=10, help="requests before the floor is read")
    parser.add_argument("--json")
    global ARGS
    ARGS = args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="edgespec-soak-"))
    draft = args.draft or draft_for(args.model, folder)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "edgespec", "serve", "-m", args.model, "-d", draft,
                               "--num-draft", "auto", "--port", str(port), "--ctx", str(args.ctx),
                               "--cache-ram", str(args.cache_ram), "--cache-disk", "0"],
                              stderr=subprocess.DEVNULL, env={**__import__("os").environ,
                                                              "EDGESPEC_HOME": str(folder)})
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        rng = random.Random(0)
        conversations = [[{"role": "system", "content": "You are a coding assistant. " * 20},
                          {"role": "user", "content": f"Write {topic}. " + "Explain each step. " * 20}]
                         for topic in TOPICS[:args.conversations]]
        samples, statuses, parts_seen, start = [], {}, [], time.time()
        for i in range(args.requests):
            messages = conversations[i % len(conversations)]
            body, continues = request(i, rng, messages)
            reply = httpx.post(base + "/v1/chat/completions", timeout=600, json=body)
            statuses[reply.status_code] = statuses.get(reply.status_code, 0) + 1
            if continues and reply.status_code == 200:
                text = reply.json()["choices"][0]["message"]["content"] or ""
                messages += [{"role": "assistant", "content": text},
                             {"role": "user", "content": f"Go on ({i})."}]
                if len(json.dumps(messages)) > args.ctx * 2:  # (keep within the context)
                    del messages[2:6]
            samples.append(rss_mib(server.pid))
            if i == args.warm_up - 1:
                warm = memory_parts(httpx.get(base + "/metrics").text)
                floor = samples[-1] - sum(warm.values())
            if i % 50 == 49:
                parts_seen.append(memory_parts(httpx.get(base + "/metrics").text))
                print(f"{i + 1} requests: RSS {samples[-1]:.1f} MiB, parts {parts_seen[-1]}",
                      file=sys.stderr, flush=True)
        metrics = httpx.get(base + "/metrics").text
        half = samples[len(samples) // 2:]
        result = {"requests": args.requests, "statuses": statuses,
                  "seconds": round(time.time() - start, 1), "model": args.model,
                  "budget_mib": args.cache_ram, "rss_after_first_mib": round(samples[0], 1),
                  "rss_after_warm_up_mib": round(samples[args.warm_up - 1], 1),
                  "parts_after_warm_up_mib": warm, "models_and_runtime_mib": round(floor, 1),
                  "rss_max_mib": round(max(samples[args.warm_up:]), 1),
                  "rss_last_mib": round(samples[-1], 1),
                  "slope_last_half_mib_per_100": round(slope_per_100(half), 3),
                  "parts_mib": memory_parts(metrics),
                  "parts_max_mib": {k: max(p.get(k, 0) for p in parts_seen) for k in parts_seen[-1]}
                  if parts_seen else {},
                  "prompt_cache_hits": metric(metrics, "edgespec:prompt_cache_hits_total"),
                  "prompt_cache_evictions": metric(metrics, "edgespec:prompt_cache_evictions_total")}
        result["within_budget"] = result["rss_max_mib"] <= floor + args.cache_ram * 1.1
        result["flat"] = result["slope_last_half_mib_per_100"] < 1.0
        print(json.dumps(result, indent=1))
        if args.json:
            with open(args.json, "w") as out:
                json.dump(dict(result, rss_mib=samples), out)
        return 0 if result["within_budget"] and result["flat"] and set(statuses) == {200} else 1
    finally:
        server.terminate()
        server.wait()


ARGS: argparse.Namespace


if __name__ == "__main__":
    sys.exit(main())
