"""Turning committed tokens into text as they stream, safely.

A token can end in the middle of a multi-byte UTF-8 character (emoji, CJK
text, byte-fallback tokens), so pieces are decoded from bytes incrementally:
an incomplete character is held back until the token that completes it.
Stop strings can span tokens too, so text that might be the start of one is
held back until it is known not to be.
"""

from __future__ import annotations

import codecs
from typing import Callable, Iterable


class IncrementalDetokenizer:
    """Decodes token bytes to text without ever splitting a character."""

    def __init__(self, token_bytes: Callable[[int], bytes]):
        self._token_bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, token_id: int) -> str:
        """The text completed by this token (possibly empty)."""
        return self._decoder.decode(self._token_bytes(token_id))

    def flush(self) -> str:
        """Whatever is left at the end (an incomplete character becomes U+FFFD)."""
        return self._decoder.decode(b"", final=True)


class StopMatcher:
    """Finds stop strings in streamed text, holding back possible beginnings."""

    def __init__(self, stop: Iterable[str] = ()):
        self.stop = [s for s in stop if s]
        self._held = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Return (text safe to emit, whether a stop string was reached)."""
        buffer = self._held + text
        hits = [i for i in (buffer.find(s) for s in self.stop) if i >= 0]
        if hits:
            self._held = ""
            return buffer[:min(hits)], True
        hold = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(buffer)), hold, -1):
                if buffer.endswith(s[:n]):
                    hold = n
                    break
        self._held = buffer[len(buffer) - hold:] if hold else ""
        return buffer[:len(buffer) - hold], False

    def flush(self, text: str = "") -> str:
        """Release held text at the end of a generation that did not stop on a string."""
        out, self._held = self._held + text, ""
        return out
