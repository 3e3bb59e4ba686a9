"""Built-in benchmark prompt sets and prompt files.

``code``, ``edit`` and ``chat`` are the tuning sets: auto mode's constants were
chosen on them. ``code-val``, ``edit-val`` and ``chat-val`` are a validation
split (other tasks, other wording) written before the auto-mode rebuild was
tuned and never tuned on: quote them separately. ``edit-chain`` and
``edit-chain-val`` hold conversations (lists of user turns) in the same two
roles, written before the suffix drafter was tuned. Requests that hand over a
whole file (30-45 lines) and ask for it back with a change, the kind a perfect
copier gains most on, were added to ``edit``, ``edit-val`` and both chain sets
before the long-copy work was tuned (6 single prompts and 2 conversations each).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from .errors import EdgespecError

TUNING_SETS = ("code", "edit", "chat")
VALIDATION_SETS = ("code-val", "edit-val", "chat-val")
BUILTIN_SETS = TUNING_SETS + VALIDATION_SETS
# Conversations (lists of user turns): write or paste code, then change it, turn after
# turn; and a chat that quotes its own earlier answers. Tuning set and validation split.
CONVERSATION_SETS = ("edit-chain", "edit-chain-val")


def load_prompt_set(name_or_file: str) -> list[str]:
    """Prompts of a built-in set, or of a file (.json list, or one prompt per line)."""
    if name_or_file in BUILTIN_SETS:
        text = resources.files("edgespec").joinpath(f"prompts/{name_or_file}.json").read_text()
        return json.loads(text)
    path = Path(name_or_file).expanduser()
    if not path.is_file():
        raise EdgespecError(f"unknown prompt set {name_or_file!r}: use one of "
                            f"{', '.join(BUILTIN_SETS + CONVERSATION_SETS)} or a file of prompts")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        try:
            prompts = json.loads(text)
        except ValueError as exc:
            raise EdgespecError(f"{path} is not valid JSON ({exc}): give a JSON list of strings") from None
        if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
            raise EdgespecError(f"{path} must hold a JSON list of prompt strings")
    else:
        prompts = [line.strip() for line in text.splitlines()]
    prompts = [p for p in prompts if p.strip()]
    if not prompts:
        raise EdgespecError(f"the prompt file {path} has no prompts: put one prompt per line")
    return prompts


def load_conversations(name_or_file: str) -> list[list[str]]:
    """Conversations (each a list of user turns) of a conversation set or file; a set
    of single prompts gives one-turn conversations."""
    if name_or_file in CONVERSATION_SETS:
        text = resources.files("edgespec").joinpath(f"prompts/{name_or_file}.json").read_text()
        return json.loads(text)
    path = Path(name_or_file).expanduser()
    if path.suffix == ".json" and path.is_file():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise EdgespecError(f"{path} is not valid JSON ({exc})") from None
        if isinstance(data, list) and data and all(
                isinstance(c, list) and c and all(isinstance(t, str) and t.strip() for t in c)
                for c in data):
            return data
    return [[prompt] for prompt in load_prompt_set(name_or_file)]
