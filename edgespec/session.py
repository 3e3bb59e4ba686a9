"""A chat conversation on an engine: history, settings, context budget, transcripts.

The conversation is re-rendered with the model's chat template every turn;
the engine's caches keep the longest common prefix, so a new turn evaluates
only the new message and the template tokens around it, on the target and on
the draft model.

May import: core, errors.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from .core.engine import Engine
from .core.generation import Chunk, PromptProgress
from .errors import EdgespecError
from .core.prompting import chat_prompt_ids
from .core.sampling import SamplingParams
from .core.shaping import Shaping
from .core.stats import GenerationStats

TRANSCRIPT_VERSION = 1


@dataclass
class TurnResult:
    """What one reply did to the conversation."""

    text: str
    finish_reason: str
    stats: GenerationStats
    dropped_messages: int = 0


@dataclass
class ChatSession:
    """One person's conversation with a model.

    ``send`` streams the reply as :class:`~edgespec.core.generation.Chunk` objects; the
    reply (or the part of it produced before an interruption) is kept in the
    history either way.
    """

    engine: Engine
    params: SamplingParams = field(default_factory=SamplingParams)
    system: str | None = None
    max_tokens: int = 1024
    speculative: bool = True
    messages: list[dict] = field(default_factory=list)
    totals: GenerationStats = field(default_factory=GenerationStats)
    last: TurnResult | None = None
    # Told how far the processing of each prompt has come (Engine.stream's ``progress``).
    progress: Callable[[PromptProgress], None] | None = None
    stop: tuple[str, ...] = ()    # a reply ends before the first of these strings
    shaping: Shaping | None = None  # penalties or a grammar, on every reply

    def conversation(self) -> list[dict]:
        """The messages as the template sees them (system message first)."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.messages

    def reset(self, *, forget_memory: bool = False) -> None:
        """Forget the conversation (the system message stays). A drafter's memory
        of earlier conversations (the suffix drafter's) stays too, unless
        ``forget_memory``."""
        self.messages.clear()
        if forget_memory:
            for drafter in self.engine.active_drafters():
                drafter.forget()

    def send(self, text: str) -> Iterator[Chunk]:
        """Add a user message and stream the assistant's reply."""
        if not text.strip():
            raise EdgespecError("empty message: type something, or /help for commands")
        self.messages.append({"role": "user", "content": text})
        try:
            prompt_ids, dropped = self._fit_context()
        except EdgespecError:
            self.messages.pop()
            raise
        pieces: list[str] = []
        final: Chunk | None = None
        try:
            for chunk in self.engine.stream(prompt_ids, self.params, max_tokens=self.max_tokens,
                                            speculative=self.speculative, progress=self.progress,
                                            stop=self.stop, shaping=self.shaping):
                pieces.append(chunk.text)
                if chunk.finish_reason is not None:
                    final = chunk
                yield chunk
        except EdgespecError:
            if not pieces:  # refused before any reply (e.g. the engine is busy)
                self.messages.pop()
            raise
        finally:
            # Interrupted or not, what was said stays in the history.
            reply = "".join(pieces)
            if self.messages and self.messages[-1]["role"] == "user":
                self.messages.append({"role": "assistant", "content": reply})
            finish = final.finish_reason if final else "cancelled"
            stats = final.stats if final else GenerationStats()
            self.last = TurnResult(reply, finish, stats, dropped)
            self.totals.merge(stats)

    def _fit_context(self) -> tuple[list[int], int]:
        """Prompt ids that leave room for a reply; drop the oldest turns if needed.

        Dropping whole user/assistant exchanges from the front (the newest
        message always stays), it finds the fewest to drop by bisection: a
        few renders of the conversation, not one per dropped exchange.
        """
        n_ctx = self.engine.n_ctx
        reserve = min(self.max_tokens, n_ctx // 4)
        count = len(self.messages)
        # Where the kept messages may start: after 0, 1, 2, ... exchanges, or at the last.
        starts = sorted(set(range(0, count - 1, 2)) | {count - 1})

        head = [{"role": "system", "content": self.system}] if self.system else []

        def render(start: int) -> list[int] | None:  # None: it does not fit
            ids = chat_prompt_ids(self.engine.target, head + self.messages[start:])
            return ids if len(ids) + reserve <= n_ctx else None

        ids = render(0)
        if ids is not None:
            return ids, 0
        lo, hi = 0, len(starts) - 1  # starts[lo] does not fit; find the first that does
        last = render(starts[hi]) if hi > lo else None
        if last is None:
            needed = len(chat_prompt_ids(self.engine.target, head + self.messages[-1:]))
            raise EdgespecError(
                f"this message needs {needed} tokens and the context holds {n_ctx} "
                f"(with {reserve} kept for the reply): shorten it or restart with a larger --ctx")
        fitting = {hi: last}
        while hi - lo > 1:
            mid = (lo + hi) // 2
            found = render(starts[mid])
            if found is None:
                lo = mid
            else:
                hi, fitting[mid] = mid, found
        dropped = starts[hi]
        del self.messages[:dropped]
        return fitting[hi], dropped

    # -- transcripts --------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> Path:
        """Write the transcript as JSON, atomically (a crash never leaves half a file)."""
        path = Path(path).expanduser()
        data = {"version": TRANSCRIPT_VERSION, "system": self.system, "messages": self.messages,
                "settings": {"temperature": self.params.temperature, "top_k": self.params.top_k,
                             "top_p": self.params.top_p, "min_p": self.params.min_p,
                             "num_draft": self.engine.num_draft}}
        if path.is_dir():
            raise EdgespecError(f"{path} is a folder: give a file name, e.g. {path / 'chat.json'}")
        tmp = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, ensure_ascii=False, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            raise EdgespecError(f"could not save the transcript to {path} "
                                f"({exc.strerror or exc}): choose another file") from None
        finally:
            if tmp is not None and Path(tmp).exists():
                Path(tmp).unlink(missing_ok=True)
        return path

    def load(self, path: str | os.PathLike) -> int:
        """Replace the conversation with a saved transcript; return its message count.

        The transcript is checked whole first: a bad file changes nothing.
        """
        path = Path(path).expanduser()
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise EdgespecError(f"no transcript at {path}: check the file name") from None
        except IsADirectoryError:
            raise EdgespecError(f"{path} is a folder: give the transcript's file") from None
        except OSError as exc:
            raise EdgespecError(f"could not read {path} ({exc.strerror or exc})") from None
        except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, nested too deep
            raise EdgespecError(f"{path} is not an edgespec transcript (not readable JSON: "
                                f"{type(exc).__name__})") from None
        messages, system = _check_transcript(data, path)
        self.messages = messages
        self.system = system
        return len(self.messages)


ROLES = ("user", "assistant", "system")


def _check_transcript(data, path: Path) -> tuple[list[dict], str | None]:
    """The messages and system message of a transcript, or a clear error."""
    def bad(why: str) -> EdgespecError:
        return EdgespecError(f"{path} is not an edgespec transcript ({why})")

    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        raise bad("it needs a list of messages")
    messages = []
    for i, message in enumerate(data["messages"]):
        if not isinstance(message, dict):
            raise bad(f"message {i} is not an object")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise bad(f"message {i} has role {role!r}: use one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise bad(f"message {i} has no text content")
        messages.append({"role": role, "content": content})
    system = data.get("system")
    if system is not None and not isinstance(system, str):
        raise bad("its system message is not text")
    return messages, system
