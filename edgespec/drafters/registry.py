"""The drafters that run no model, by the name ``-d``, the server and bench take.

One line each: the name, where the class is (imported when first used), and what the
help says of it. A drafter written in a file of its own becomes available to ``edgespec
chat``, ``generate``, ``serve`` (a request's ``speculative.drafter``) and ``bench``
(``--drafters``) with a line here (docs/drafters.md).
"""

from __future__ import annotations

from importlib import import_module

from .base import Drafter

BUILTIN: dict[str, tuple[str, str]] = {
    "lookup": ("edgespec.drafters.prompt_lookup:PromptLookup",
               "prompt lookup: continue an earlier occurrence of the text's end (the default)"),
    "suffix": ("edgespec.drafters.suffix:SuffixDrafter",
               "continuation counts over this and earlier conversations"),
    "lastline": ("edgespec.drafters.last_line:RepeatLastLine",
                 "the line before again, where this line starts as it did"),
}


def make_drafter(name: str) -> Drafter:
    """A new drafter of the built-in kind ``name`` (a key of :data:`BUILTIN`)."""
    module, _, cls = BUILTIN[name][0].partition(":")
    return getattr(import_module(module), cls)()


def drafter_help() -> str:
    """The built-in drafters for a command's help: "'lookup' (...), 'suffix' (...)"."""
    return ", ".join(f"'{name}' ({text})" for name, (_, text) in BUILTIN.items())
