"""Greedy continuations of the same GGUF file on llama.cpp and on MLX, side by side.

Prints, per prompt, how many tokens agree and, where they first differ, how
far each backend's two candidate tokens are from its best logit (a near-tie
when both are small).

    python scripts/compare_backends.py -m smollm2-135m-instruct
"""

from __future__ import annotations

import argparse

from edgespec import Engine, SamplingParams
from edgespec.models.loading import BackendOptions, load_backend
from edgespec.core.prompting import chat_prompt_ids

PROMPTS = ["What is the capital of France?", "Write a haiku about autumn.",
           "Explain what a CPU does in one paragraph.", "List three primary colors.",
           "What is 2 + 2?", "Give me a tip for learning to code."]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", default="smollm2-135m-instruct")
    parser.add_argument("-n", "--max-tokens", type=int, default=32)
    args = parser.parse_args()
    backends = {kind: load_backend(args.model, BackendOptions(backend=kind, n_ctx=1024))
                for kind in ("llama.cpp", "mlx")}
    greedy = SamplingParams(temperature=0)
    for prompt in PROMPTS:
        ids = chat_prompt_ids(backends["llama.cpp"], [{"role": "user", "content": prompt}])
        out = {k: Engine(b).generate(ids, greedy, max_tokens=args.max_tokens).token_ids
               for k, b in backends.items()}
        a, b = out["llama.cpp"], out["mlx"]
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if first is None:
            print(f"{len(a):3d}/{len(a)} identical  {prompt!r}")
            continue
        gaps = []
        for kind, backend in backends.items():
            backend.rewind(0)
            logits = backend.forward(ids + a[:first], last_only=True)[-1]
            gaps.append(f"{kind}: best-{a[first]} {logits.max() - logits[a[first]]:.3f}, "
                        f"best-{b[first]} {logits.max() - logits[b[first]]:.3f}")
        print(f"{first:3d}/{min(len(a), len(b))} differ at token {first} "
              f"(llama.cpp {a[first]}, mlx {b[first]}; {'; '.join(gaps)})  {prompt!r}")


if __name__ == "__main__":
    main()
