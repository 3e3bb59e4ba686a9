"""How far does a KV-shifted cache move the logits? (``--cache-reuse``, docs/exactness.md)

A client that trims its history (a chat UI dropping old turns, aider replacing
them with a summary) sends a prompt whose later part was cached after text that
is now gone. ``--cache-reuse N`` moves such cached chunks into place by KV shift
instead of evaluating them again (as llama-server's does). Their K/V were
computed after the dropped text, so the next logits are not a cold run's. This
measures by how much, on the captured sessions: for each aider edit that follows
another, the cache holds the earlier prompt with its previous exchange; the new
prompt drops that exchange. Compared over the last 32 prompt tokens (evaluated
in the same pass both ways): the cold run, the shifted cache, and, as the scale
of rounding alone, the cold run with its prefix evaluated in other pieces.

    python scripts/measure_cache_reuse.py --model qwen2.5-coder-1.5b-instruct
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from edgespec.backends.llamacpp import LlamaCppBackend
from edgespec.core.cache import CachedModel
from edgespec.core.prompt_cache import PromptCache
from edgespec.core.prompting import chat_prompt_ids
from edgespec.core.shaping import log_softmax

PROMPTS = Path(__file__).parent.parent / "edgespec" / "prompts"
TAIL = 32


def compare(cold: np.ndarray, other: np.ndarray) -> dict:
    """KL(cold || other) per row, the largest logit difference, top-1 agreement."""
    p = np.array([log_softmax(row) for row in cold])
    q = np.array([log_softmax(row) for row in other])
    kl = (np.exp(p) * (p - q)).sum(axis=-1)
    return {"kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
            "max_abs_logit": float(np.abs(cold - other).max()),
            "top1_agree": float((cold.argmax(-1) == other.argmax(-1)).mean())}


def cases(split: str) -> list[tuple[list[dict], list[dict]]]:
    """(old messages, new messages): an aider edit with its previous exchange, and the
    same edit with that exchange dropped (the user's ask and the model's reply)."""
    out = []
    for session in json.loads((PROMPTS / f"{split}.json").read_text()):
        for body in session["requests"]:
            messages = body["messages"]
            roles = [m["role"] for m in messages]
            # aider: ..., user (previous ask), assistant (its reply), user (files), ...
            for i in range(1, len(messages) - 3):
                if roles[i:i + 3] == ["user", "assistant", "user"] and len(messages[i + 1]["content"]) > 500:
                    out.append((messages, messages[:i] + messages[i + 2:]))
                    break
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--split", default="sessions-val")
    parser.add_argument("--ctx", type=int, default=8192)
    parser.add_argument("--min-chunk", type=int, default=256)
    args = parser.parse_args()
    from edgespec.models.catalog import resolve_model
    path = resolve_model(args.model, fetch=True)
    backend = LlamaCppBackend(path, n_ctx=args.ctx, kernels="fast")
    rows = []
    for old_messages, new_messages in cases(args.split):
        old = chat_prompt_ids(backend, old_messages)
        new = chat_prompt_ids(backend, new_messages)
        head, tail = new[:-TAIL], new[-TAIL:]
        cache = CachedModel(backend, PromptCache(0, shift_min=args.min_chunk))
        cache.forward(head)
        cold = cache.forward(tail)
        cache.rewind(0)  # the same, its prefix in 64-token pieces: rounding alone
        for i in range(0, len(head), 64):
            cache.forward(head[i:i + 64], last_only=True)
        pieces = cache.forward(tail)
        cache.rewind(0)
        cache.forward(old)
        kept, _ = cache.reuse(head)
        shifted = cache.forward(tail)
        row = {"old": len(old), "new": len(new), "kept": kept,
               "shifted": compare(cold, shifted), "rounding": compare(cold, pieces)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if rows:
        for what in ("shifted", "rounding"):
            agg = {k: (min(r[what][k] for r in rows), max(r[what][k] for r in rows)) for k in rows[0][what]}
            print(f"{what:9} " + ", ".join(f"{k} {lo:.4g}–{hi:.4g}" for k, (lo, hi) in agg.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
