"""From chat messages (or raw text) to the target's prompt token ids."""

from __future__ import annotations

from .backend import Backend


def chat_prompt_ids(backend: Backend, messages: list[dict], *,
                    add_generation_prompt: bool = True, tools: list[dict] | None = None) -> list[int]:
    """Render ``messages`` with the model's chat template and tokenize them.
    ``tools``: tool definitions for the template's tools section (OpenAI's shape).

    Special tokens in the template are parsed; the BOS token is added only
    when the vocabulary wants one and the template did not write it already.
    """
    check_messages(messages)
    limit = max_prompt_chars(backend)
    text = backend.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                       max_chars=limit, **({"tools": tools} if tools else {}))
    check_prompt_chars(text, backend)
    ids = backend.tokenize(text, add_bos=False, special=True)
    bos = backend.vocab.bos_token_id
    if bos is not None and (not ids or ids[0] != bos):
        ids.insert(0, bos)
    return ids


def check_messages(messages) -> None:
    """Refuse anything but a non-empty list of ``{"role": str, "content": str}``."""
    from ..errors import EdgespecError
    usage = 'give a list of {"role": "user" | "assistant" | "system", "content": "..."} dicts'
    if not isinstance(messages, (list, tuple)) or not messages:
        raise EdgespecError(f"messages must be a non-empty list, got {type(messages).__name__}: {usage}")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise EdgespecError(f"message {i} is a {type(message).__name__}, not a dict: {usage}")
        content = message.get("content")
        if message.get("tool_calls") and content is None:  # (an assistant's call: no text)
            content = ""
        if not isinstance(message.get("role"), str) or not isinstance(content, str):
            raise EdgespecError(f"message {i} needs a string 'role' and a string 'content': {usage}")


def prompt_ids(backend: Backend, prompt) -> list[int]:
    """Token ids of a prompt given as text (tokenized as it is, special tokens parsed)
    or as ids (checked against ``backend``'s vocabulary)."""
    import numpy as np

    from .backend import check_token_ids
    from ..errors import EdgespecError
    if isinstance(prompt, str):
        return raw_prompt_ids(backend, prompt)
    if not isinstance(prompt, (list, tuple, range, np.ndarray)):
        raise EdgespecError(f"the prompt is a {type(prompt).__name__}: give text, or a list "
                            f"of token ids")
    for token in prompt:
        if isinstance(token, (bool, np.bool_)) or not isinstance(token, (int, np.integer)):
            raise EdgespecError(f"token id {token!r} is not an integer: give a list of token ids")
    ids = [int(t) for t in prompt]
    check_token_ids(ids, backend.vocab.size)
    return ids


def raw_prompt_ids(backend: Backend, text: str) -> list[int]:
    """Tokenize text as it is (BOS added if the vocabulary wants one)."""
    check_prompt_chars(text, backend)
    return backend.tokenize(text, add_bos=True, special=True)


# No token of any vocabulary we know spells more characters than this, so a text
# longer than n_ctx times it cannot fit the context, and is refused before the
# tokenizer spends memory and time on it.
MAX_TOKEN_CHARS = 256


def max_prompt_chars(backend: Backend) -> int:
    """The longest text that could still fit ``backend``'s context."""
    return backend.n_ctx * MAX_TOKEN_CHARS


def check_prompt_chars(text: str, backend: Backend) -> None:
    """Refuse a text too long for the context before it is tokenized."""
    from ..errors import EdgespecError
    if len(text) > max_prompt_chars(backend):
        raise EdgespecError(f"the prompt is {len(text):,} characters: more than a context of "
                            f"{backend.n_ctx} tokens can hold; shorten it or raise --ctx")
