"""Log probabilities in the replies' shapes: a chat completion's ``logprobs.content``,
a text completion's ``tokens``/``token_logprobs``/``top_logprobs``/``text_offset``, and
llama-server's ``completion_probabilities`` entries, from the engine's per-token entries."""

from __future__ import annotations

FLOOR = -9999.0  # OpenAI's logprob for a token that cannot come (JSON has no -inf)


def token_entries(entries: list[dict], token_bytes, *, ids: bool = False) -> list[dict]:
    """Each token of the engine's entries with its text, logprob and bytes, and its
    ``top_logprobs`` alike (``ids``: with the token ids too, as llama-server's
    ``completion_probabilities`` has them)."""
    def one(token: int, logprob: float) -> dict:
        piece = token_bytes(token)
        return {**({"id": token} if ids else {}), "token": piece.decode("utf-8", "replace"),
                "logprob": max(logprob, FLOOR), "bytes": list(piece)}
    return [{**one(e["id"], e["logprob"]),
             "top_logprobs": [one(t, lp) for t, lp in e["top"] if lp > float("-inf")]} for e in entries]


def chat_logprobs(entries: list[dict], token_bytes) -> dict:
    """``choices[].logprobs`` of a chat completion from the engine's entries."""
    return {"content": token_entries(entries, token_bytes)}


def completion_logprobs(entries: list[dict], token_bytes, offset: int = 0) -> dict:
    """``choices[].logprobs`` of a (legacy) text completion."""
    tokens = [token_bytes(e["id"]).decode("utf-8", "replace") for e in entries]
    offsets, at = [], offset
    for text in tokens:
        offsets.append(at)
        at += len(text)
    return {"tokens": tokens, "token_logprobs": [max(e["logprob"], FLOOR) for e in entries],
            "top_logprobs": [{token_bytes(t).decode("utf-8", "replace"): lp for t, lp in e["top"]
                              if lp > float("-inf")} for e in entries],
            "text_offset": offsets}
