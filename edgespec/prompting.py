"""From chat messages (or raw text) to the target's prompt token ids."""

from __future__ import annotations

from .backends.base import Backend


def chat_prompt_ids(backend: Backend, messages: list[dict], *,
                    add_generation_prompt: bool = True) -> list[int]:
    """Render ``messages`` with the model's chat template and tokenize them.

    Special tokens in the template are parsed; the BOS token is added only
    when the vocabulary wants one and the template did not write it already.
    """
    text = backend.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    ids = backend.tokenize(text, add_bos=False, special=True)
    bos = backend.vocab.bos_token_id
    if bos is not None and (not ids or ids[0] != bos):
        ids.insert(0, bos)
    return ids


def raw_prompt_ids(backend: Backend, text: str) -> list[int]:
    """Tokenize text as it is (BOS added if the vocabulary wants one)."""
    return backend.tokenize(text, add_bos=True, special=True)
