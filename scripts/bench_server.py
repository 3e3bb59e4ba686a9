"""Does serving cost anything? tok/s through `edgespec serve` vs the engine directly.

One engine, loaded once; for each prompt and repeat, interleaved: a
streaming chat completion through the real HTTP server (one client, the
`openai` package) and the same generation through ``Engine.chat`` in
process, same settings, both generated in the main thread (as ``edgespec
serve`` does: HTTP and the client run in other threads). Both are timed the same way, from the first token
received to the last, so prefill is left out of both (as in edgespec's
tok/s). Prints per-run tok/s and the ratio server / direct (median, min–max).

    python scripts/bench_server.py --json bench-out/server.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

import edgespec
from edgespec import SamplingParams
from edgespec.measure.prompt_sets import load_prompt_set
from edgespec.serve.server import ServerSettings, bind, create_app


def rate(times: list[float]) -> float:
    """Tokens per second between the first token and the last."""
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--num-draft", default="auto")
    parser.add_argument("--prompts", default="edit:0,code:0,chat:0")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temp", type=float, default=0.0)
    parser.add_argument("--json")
    args = parser.parse_args()

    import openai
    import uvicorn
    k = args.num_draft if args.num_draft == "auto" else int(args.num_draft)
    engine = edgespec.load(args.model, draft=args.draft, num_draft=k)
    settings = ServerSettings((engine.target.name,), SamplingParams(temperature=args.temp), k)
    # As `edgespec serve` runs: HTTP in a thread, generations in this (the main) thread.
    app = create_app(engine, settings, worker_thread=False)
    server = app.state.server
    sock = bind("127.0.0.1", 0)
    http = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    threading.Thread(target=http.run, kwargs={"sockets": [sock]}).start()
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{sock.getsockname()[1]}/v1", api_key="none")
    params = SamplingParams(temperature=args.temp, seed=0)
    rows = []

    def direct(messages) -> list[float]:
        """The same generation in process, in the same (main) thread as the server's."""
        times, done = [], threading.Event()

        def job():
            try:
                for chunk in engine.chat(messages, params=params, max_tokens=args.max_tokens):
                    if chunk.text:
                        times.append(time.perf_counter())
            finally:
                done.set()
        server.jobs.put(job)
        done.wait()
        return times

    def measure():
        try:
            for spec in args.prompts.split(","):
                set_name, index = spec.split(":")
                messages = [{"role": "user", "content": load_prompt_set(set_name)[int(index)]}]
                for repeat in range(args.repeat):
                    for mode in ("server", "direct") if repeat % 2 == 0 else ("direct", "server"):
                        times = []
                        if mode == "server":
                            stream = client.chat.completions.create(
                                model=engine.target.name, messages=messages, temperature=args.temp,
                                seed=0, max_tokens=args.max_tokens, stream=True)
                            for chunk in stream:
                                if chunk.choices and chunk.choices[0].delta.content:
                                    times.append(time.perf_counter())
                        else:
                            times = direct(messages)
                        rows.append({"prompt": spec, "repeat": repeat, "mode": mode,
                                     "tokens": len(times), "tokens_per_second": rate(times)})
                        print(f"{spec} #{repeat} {mode:6}: {rows[-1]['tokens_per_second']:.2f} tok/s "
                              f"({len(times)} tokens)", flush=True)
        finally:
            server.stop_work()

    threading.Thread(target=measure).start()
    try:
        server.work()
    finally:
        http.should_exit = True
        engine.close()
    ratios = []
    for spec in args.prompts.split(","):
        for repeat in range(args.repeat):
            pair = {r["mode"]: r["tokens_per_second"] for r in rows
                    if r["prompt"] == spec and r["repeat"] == repeat}
            ratios.append(pair["server"] / pair["direct"])
    print(f"server / direct tok/s: median {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}) over {len(ratios)} pairs")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "ratios": ratios}, indent=1))


if __name__ == "__main__":
    main()
