"""Does the server's memory stay within the prompt cache's budget? A soak on loopback.

Starts ``edgespec serve`` with a small ``--cache-ram`` and sends 300+ requests over
four conversations that alternate, each followed now and then by a side request (a
summary of it, as aider sends), so that saved states are made, restored and evicted
all along. It reads the server's resident memory (``/proc/PID/status`` VmRSS) after
every request, and ``/metrics`` for the prompt cache's bytes. The bar: the largest
RSS stays within the RSS after the first request (the models, the KV cache, the
runtime) plus the budget, plus 10% of the budget for the runtime's own churn.

    python scripts/soak_sessions.py --model smollm2-135m-instruct --cache-ram 64 --requests 320
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import time

import httpx

from capture_clients import free_port  # (scripts/, on the path when run as a script)

TOPICS = ["a function that parses dates", "a class for a bank account", "a CSV reader",
          "a retry decorator with backoff"]


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--cache-ram", type=int, default=64, help="MiB")
    parser.add_argument("--requests", type=int, default=320)
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--json")
    args = parser.parse_args()

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "edgespec", "serve", "-m", args.model,
                               "--port", str(port), "--ctx", str(args.ctx), "--cache-ram",
                               str(args.cache_ram), "--cache-disk", "0"], stderr=subprocess.DEVNULL)
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
                         for topic in TOPICS]
        samples, start = [], time.time()
        for i in range(args.requests):
            which = i % len(conversations)
            messages = conversations[which]
            side = rng.random() < 0.3
            if side:  # a side request: another prompt, made of the conversation's text
                body = [{"role": "system", "content": "Summarize this conversation in one line."},
                        {"role": "user", "content": "\n".join(m["content"] for m in messages)[-3000:]}]
            else:
                body = messages
            reply = httpx.post(base + "/v1/chat/completions", timeout=600, json={
                "messages": body, "max_tokens": args.max_tokens, "temperature": 0}).json()
            if not side:
                text = reply["choices"][0]["message"]["content"]
                messages += [{"role": "assistant", "content": text},
                             {"role": "user", "content": f"Go on ({i})."}]
                if len(json.dumps(messages)) > args.ctx * 2:  # (keep within the context)
                    del messages[2:6]
            samples.append(rss_mib(server.pid))
            if i == 0:
                floor = samples[0]
        metrics = httpx.get(base + "/metrics").text
        held = metric(metrics, "edgespec:prompt_cache_bytes") / 2**20
        result = {"requests": args.requests, "seconds": round(time.time() - start, 1),
                  "budget_mib": args.cache_ram, "rss_after_first_mib": round(floor, 1),
                  "rss_max_mib": round(max(samples), 1), "prompt_cache_held_mib": round(held, 1),
                  "hits": metric(metrics, "edgespec:prompt_cache_hits_total"),
                  "evictions": metric(metrics, "edgespec:prompt_cache_evictions_total")}
        result["within_budget"] = result["rss_max_mib"] <= floor + args.cache_ram * 1.1
        print(json.dumps(result, indent=1))
        if args.json:
            with open(args.json, "w") as out:
                json.dump(dict(result, rss_mib=samples), out)
        return 0 if result["within_budget"] else 1
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    sys.exit(main())
