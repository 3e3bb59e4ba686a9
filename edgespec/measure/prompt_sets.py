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

``client`` and ``client-val`` hold requests captured from real clients driving
``edgespec serve`` (``scripts/capture_clients.py``): aider asking for whole files
back and for search/replace edits, a conversation about code as the chat page
sends it, an editor's "apply this change to the file". Each entry is a whole
request (its messages as sent, long system prompts included), grouped by the
client session it came from; ``client-val`` was captured before any tuning on
them and is never tuned on. (aider's second request on glob.py, a retry after its
search/replace edit failed to apply, is left out: 8,874 prompt tokens, more than the
8,192-token context it was captured with, so the server refused it.)
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from ..errors import EdgespecError

TUNING_SETS = ("code", "edit", "chat")
VALIDATION_SETS = ("code-val", "edit-val", "chat-val")
BUILTIN_SETS = TUNING_SETS + VALIDATION_SETS
# Conversations (lists of user turns): write or paste code, then change it, turn after
# turn; and a chat that quotes its own earlier answers. Tuning set and validation split.
CONVERSATION_SETS = ("edit-chain", "edit-chain-val")
# Requests captured from real clients (each a whole message list): tuning set, validation split.
REQUEST_SETS = ("client", "client-val")
ALL_SETS = BUILTIN_SETS + CONVERSATION_SETS + REQUEST_SETS

# A conversation's turn: a user message (the history is the replies generated before
# it), or a captured request's whole message list (its history as the client sent it).
Turn = str | list[dict]


def load_prompt_set(name_or_file: str) -> list[str]:
    """Prompts of a built-in set, or of a file (.json list, or one prompt per line)."""
    if name_or_file in BUILTIN_SETS:
        text = resources.files("edgespec").joinpath(f"prompts/{name_or_file}.json").read_text()
        return json.loads(text)
    path = Path(name_or_file).expanduser()
    if not path.is_file():
        raise EdgespecError(f"unknown prompt set {name_or_file!r}: use one of "
                            f"{', '.join(ALL_SETS)} or a file of prompts")
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


def load_conversations(name_or_file: str) -> list[list[Turn]]:
    """Conversations (each a list of turns: user messages, or captured requests'
    message lists) of a conversation or request set or file; a set of single prompts
    gives one-turn conversations."""
    if name_or_file in REQUEST_SETS:
        return load_requests(name_or_file)
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


def request_entries(name: str) -> list[dict]:
    """The captured requests of a request set as stored: each with its ``job`` (the
    client session), ``client`` (e.g. ``aider-whole``), ``turn`` and ``messages``."""
    return json.loads(resources.files("edgespec").joinpath(f"prompts/{name}.json").read_text())


def load_requests(name: str) -> list[list[list[dict]]]:
    """The captured requests of a request set, as conversations: one per client
    session (aider's run on a file, a chat), each turn the messages it sent."""
    sessions: dict[str, list[list[dict]]] = {}
    for entry in request_entries(name):
        sessions.setdefault(entry["job"], []).append(entry["messages"])
    return list(sessions.values())


def turn_messages(history: list[dict], turn: Turn) -> list[dict]:
    """The messages of a conversation's next turn: a captured request as it was sent,
    or ``history`` (which this extends) and the user's turn. The caller appends the
    reply to ``history``."""
    if isinstance(turn, str):
        history.append({"role": "user", "content": turn})
        return history
    return list(turn)
