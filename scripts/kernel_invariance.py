"""Where a batched pass departs from one-token steps, on llama.cpp's CPU backend.

After a prompt of L tokens, n tokens are evaluated once as one pass and once as n
one-token steps; the script prints the largest |logit difference| over the rows
(0 means bit-identical). Each setting runs in its own process, since llama.cpp reads
its switches (``GGML_CPU_TILED_MM``, the repacked buffers) when it first loads.

    python scripts/kernel_invariance.py [--model qwen2.5-coder-1.5b-instruct]
        [--sizes 2,4,8,9,16,33,64,65] [--contexts 60,700] [--settings default,exact]
    python scripts/kernel_invariance.py --model smollm2-135m-instruct --settings mlx

Settings (``--settings``; names of :data:`SETTINGS`): edgespec's default, and the
switches one at a time, so the op each one governs shows.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

NO_REPACK, UNTILED = {"EDGESPEC_LLAMA_REPACK": "0"}, {"GGML_CPU_TILED_MM": "0"}
# name -> (environment, the backend's options)
SETTINGS = {
    "default": ({}, {}),  # (flash attention: llama.cpp's auto)
    "nofa": ({}, {"flash_attn": False}),
    "fa": ({}, {"flash_attn": True}),
    "norepack": (NO_REPACK, {"flash_attn": False}),
    "norepack+fa": (NO_REPACK, {"flash_attn": True}),
    "norepack+fa+untiled": ({**NO_REPACK, **UNTILED}, {"flash_attn": True}),
    "norepack+fa+kvq8": (NO_REPACK, {"flash_attn": True, "kv_cache_type": "q8_0"}),
    "norepack+fa+untiled+kvq8": ({**NO_REPACK, **UNTILED}, {"flash_attn": True, "kv_cache_type": "q8_0"}),
    "fa+kvq8": ({}, {"flash_attn": True, "kv_cache_type": "q8_0"}),
    "exact": ({}, {"kernels": "exact"}),  # what --kernels exact sets (verify passes in pieces)
    "mlx": ({}, {"backend": "mlx"}),
}


def probe(model: str, sizes: list[int], contexts: list[int], options: dict) -> dict:
    """In this process: {context: {n: max |difference|}}."""
    from edgespec.backends.kernels import pass_difference
    from edgespec.models.loading import BackendOptions, load_backend

    if options.get("backend") == "mlx":  # (MLX has no such settings: its one way, measured)
        backend = load_backend(model, BackendOptions(backend="mlx", n_ctx=2048, fetch=True))
    else:
        from edgespec.backends.llamacpp import LlamaCppBackend
        from edgespec.models.catalog import resolve_model
        backend = LlamaCppBackend(resolve_model(model, fetch=True), n_ctx=2048, **options)
    text = ("def mean(xs):\n    return sum(xs) / len(xs)\n\n" * 200)
    corpus = backend.tokenize(text, add_bos=False, special=False)
    result = {}
    for length in contexts:
        prompt = corpus[:length]
        tokens = corpus[length:length + max(sizes)]
        result[length] = {}
        for n in sizes:
            result[length][n] = pass_difference(backend, prompt, tokens[:n])
    backend.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--sizes", default="2,4,5,8,9,16,33,63,64,65")
    parser.add_argument("--contexts", default="60,700")
    parser.add_argument("--settings", default=",".join(s for s in SETTINGS if s != "mlx"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    contexts = [int(c) for c in args.contexts.split(",")]
    if args.child:
        print(json.dumps(probe(args.model, sizes, contexts, json.loads(args.child))))
        return
    print(f"{args.model}: max |logit difference|, n-token pass vs n one-token steps")
    print("setting".ljust(22) + "ctx  " + " ".join(f"n={n:<6}" for n in sizes))
    for name in args.settings.split(","):
        env, options = SETTINGS[name]
        out = subprocess.run([sys.executable, __file__, "--model", args.model, "--sizes", args.sizes,
                              "--contexts", args.contexts, "--child", json.dumps(options)],
                             env={**os.environ, **env}, capture_output=True, text=True)
        if out.returncode:
            print(f"{name}: failed\n{out.stderr[-2000:]}")
            continue
        result = json.loads(out.stdout.strip().splitlines()[-1])
        for length in contexts:
            row = result[str(length)]
            print(name.ljust(22) + f"{length:<5}" + " ".join(f"{row[str(n)]:<8.3g}" for n in sizes),
                  flush=True)


if __name__ == "__main__":
    main()
