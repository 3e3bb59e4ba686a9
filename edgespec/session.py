"""A chat conversation on an engine: history, settings, context budget, transcripts.

The conversation is re-rendered with the model's chat template every turn;
the engine's caches keep the longest common prefix, so a new turn evaluates
only the new message and the template tokens around it, on the target and on
the draft model.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from .engine import Chunk, Engine
from .errors import EdgespecError
from .prompting import chat_prompt_ids
from .sampling import SamplingParams
from .stats import GenerationStats

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

    ``send`` streams the reply as :class:`~edgespec.engine.Chunk` objects; the
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

    def conversation(self) -> list[dict]:
        """The messages as the template sees them (system message first)."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.messages

    def reset(self) -> None:
        """Forget the conversation (the system message stays)."""
        self.messages.clear()

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
                                            speculative=self.speculative):
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
        """Prompt ids that leave room for a reply; drop the oldest turns if needed."""
        n_ctx = self.engine.target.n_ctx
        reserve = min(self.max_tokens, n_ctx // 4)
        dropped = 0
        while True:
            ids = chat_prompt_ids(self.engine.target, self.conversation())
            if len(ids) + reserve <= n_ctx:
                return ids, dropped
            if len(self.messages) <= 1:
                raise EdgespecError(
                    f"this message needs {len(ids)} tokens and the context holds {n_ctx} "
                    f"(with {reserve} kept for the reply): shorten it or restart with a larger --ctx")
            # Drop the oldest user/assistant exchange.
            del self.messages[:2 if len(self.messages) > 2 else 1]
            dropped += 2

    # -- transcripts --------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> Path:
        """Write the transcript as JSON, atomically (a crash never leaves half a file)."""
        path = Path(path).expanduser()
        data = {"version": TRANSCRIPT_VERSION, "system": self.system, "messages": self.messages,
                "settings": {"temperature": self.params.temperature, "top_k": self.params.top_k,
                             "top_p": self.params.top_p, "min_p": self.params.min_p,
                             "num_draft": self.engine.num_draft}}
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, ensure_ascii=False, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    def load(self, path: str | os.PathLike) -> int:
        """Replace the conversation with a saved transcript; return its message count."""
        path = Path(path).expanduser()
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            messages = data["messages"]
            if not all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in messages):
                raise ValueError("messages need a role and a content")
        except FileNotFoundError:
            raise EdgespecError(f"no transcript at {path}: check the file name") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise EdgespecError(f"{path} is not an edgespec transcript ({exc})") from None
        self.messages = [{"role": m["role"], "content": m["content"]} for m in messages]
        self.system = data.get("system")
        return len(self.messages)
