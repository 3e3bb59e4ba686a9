"""The one name table: a drafter's name (``-d``, a request's ``speculative.drafter``,
bench's ``--drafters``, a saved profile) to a drafter. Names are compared here and
nowhere else (and by the drafters themselves, which carry their own).

One line each in :data:`BUILTIN`: the name, where the class is (imported when first
used), and what the help says of it. A drafter written in a file of its own becomes
available to ``edgespec chat``, ``generate``, ``serve`` and ``bench`` with a line here
(docs/drafters.md). Besides these, a name is a draft model (a path, a known model's
name) or one of the words :data:`NONE` (no drafter: ``-d none``), :data:`OFF` (a
request's: no speculation) and :data:`MODEL` (a request's: the server's draft model).
"""

from __future__ import annotations

from importlib import import_module
from typing import Callable

from ..core.draft import MODEL as MODEL_KIND
from ..core.draft import NO_DRAFTER
from ..core.draft import Drafter
from ..errors import EdgespecError

BUILTIN: dict[str, tuple[str, str]] = {
    "lookup": ("edgespec.drafters.prompt_lookup:PromptLookup",
               "prompt lookup: continue an earlier occurrence of the text's end (the default)"),
    "suffix": ("edgespec.drafters.suffix:SuffixDrafter",
               "continuation counts over this and earlier conversations"),
    "lastline": ("edgespec.drafters.last_line:RepeatLastLine",
                 "the line before again, where this line starts as it did"),
}
DEFAULT = "lookup"   # what drafts where nothing is said: costs nothing to ask
NONE = NO_DRAFTER    # -d none: no drafter
OFF = "off"          # a request's drafter: no speculation
MODEL = "model"      # a request's drafter: the draft model the server was started with
REQUEST_CHOICES = (*BUILTIN, MODEL, OFF)  # what a request's speculative.drafter may name


def is_builtin(name: str | None) -> bool:
    """Whether ``name`` is a drafter of :data:`BUILTIN` (one that runs no model)."""
    return name in BUILTIN


def runs_no_model(name: str | None) -> bool:
    """Whether ``name`` (a ``-d`` value) asks for no draft model: none, or a built-in one."""
    return name is None or name == NONE or is_builtin(name)


def make_drafter(name: str) -> Drafter:
    """A new drafter of the built-in kind ``name`` (a key of :data:`BUILTIN`)."""
    module, _, cls = BUILTIN[name][0].partition(":")
    return getattr(import_module(module), cls)()


def drafter_from_name(name: str | None, load_model: Callable[[str], Drafter]) -> Drafter | None:
    """The drafter a ``-d`` value names: None for none, a built-in one, else the draft
    model ``load_model(name)`` loads."""
    if name is None or name == NONE:
        return None
    if is_builtin(name):
        return make_drafter(name)
    return load_model(name)


def listed_companion(drafters: dict[str, Drafter]) -> Drafter | None:
    """Of the drafters listed by name, the one to ask before a draft model in auto mode
    (the suffix drafter, which remembers earlier conversations), if listed."""
    return drafters.get("suffix")


def drafter_help() -> str:
    """The built-in drafters for a command's help: "'lookup' (...), 'suffix' (...)"."""
    return ", ".join(f"'{name}' ({text})" for name, (_, text) in BUILTIN.items())


class RequestDrafters:
    """The drafters a server's requests choose among by name (:data:`REQUEST_CHOICES`):
    the one it started with (a draft model, or a built-in one), and built-in ones made
    when first asked for (each kept, with what auto mode learns of it)."""

    def __init__(self, started: Drafter | None):
        self.model = started if started is not None and started.kind == MODEL_KIND else None
        self._made: dict[str, Drafter] = {started.name: started} \
            if started is not None and is_builtin(started.name) else {}
        # What a request that does not say gets: as the server was started.
        self.default = OFF if started is None else MODEL if self.model else started.name

    def get(self, name: str | None) -> Drafter | None:
        """The drafter ``name`` chooses (None: the default); None for :data:`OFF`."""
        name = name or self.default
        if name == OFF:
            return None
        if name == MODEL:
            if self.model is None:
                raise EdgespecError("this server has no draft model: use a drafter that runs none "
                                    f"({', '.join(BUILTIN)}) or {OFF} (or start it with -d MODEL)")
            return self.model
        if name not in self._made:
            self._made[name] = make_drafter(name)
        return self._made[name]
