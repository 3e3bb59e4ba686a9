"""Grammars that constrain a reply: JSON (any object, or a JSON schema), regular
expressions, Lark grammars, through llguidance.

llguidance (Microsoft's, the one llama.cpp can build with) was chosen over
xgrammar for two reasons: its wheel needs nothing else (xgrammar's pulls in
PyTorch; xgrammar's mask time was not measured here), and its matcher takes a
draft token by token and rolls back any number of tokens, which is what verifying
a draft needs (llguidance's own mask and shaping time, 0.3-0.5 ms a token, is in
docs/api.md). A :class:`Grammar` is a :class:`~edgespec.core.shaping.TokenRule`: the
engine asks it how far a draft can go and for the mask of each verify row.
"""

from __future__ import annotations

import json
import threading
import weakref
from typing import Sequence

import numpy as np

_TOKENIZERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()
SPECIAL = b"\xff"  # llguidance's mark of a special token (never matched as text)


def tokenizer_of(target):
    """llguidance's view of ``target``'s vocabulary: each token's bytes, special
    tokens marked, built once per model (a 150k vocabulary takes about a second)."""
    import llguidance
    with _LOCK:
        if target in _TOKENIZERS:
            return _TOKENIZERS[target]
        vocab = target.vocab
        # (the vocabulary's labelled tokens but its newline, which is text)
        special = set(vocab.eos_token_ids) | {t for label, t in vocab.special_token_ids.items()
                                              if label != "nl"}
        if vocab.bos_token_id is not None:
            special.add(vocab.bos_token_id)
        tokens = []
        for i in range(vocab.size):
            piece = target.token_bytes(i)
            if i in special or not piece:
                piece = SPECIAL + target.token_text(i).encode("utf-8", "replace")
            tokens.append(piece)
        eos = min(vocab.eos_token_ids) if vocab.eos_token_ids else None
        if eos is None:
            raise ValueError("this model has no end-of-generation token: a grammar cannot end it")

        class Vocabulary:  # what llguidance's TokenizerWrapper reads
            eos_token_id, bos_token_id = eos, vocab.bos_token_id
            special_token_ids = sorted(special)

            def __init__(self):
                self.tokens = tokens

            def __call__(self, text):
                if isinstance(text, bytes):
                    text = text.decode("utf-8", "replace")
                return _tokenize(target, text)

        made = llguidance.LLTokenizer(llguidance.TokenizerWrapper(Vocabulary()),
                                      eos_token=sorted(vocab.eos_token_ids))
        _TOKENIZERS[target] = made
        return made


def closed(schema):
    """``schema`` with every object that does not say otherwise closed to properties
    beyond those listed (``additionalProperties: false``), as OpenAI's strict mode has it."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: closed(value) if key not in ("enum", "const", "default", "examples") else value
           for key, value in schema.items()}
    if (out.get("type") == "object" or "properties" in out) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _tokenize(target, text: str) -> list[int]:
    """``text``'s tokens, nothing added: a SentencePiece vocabulary writes a space
    before a text, so there the text is tokenized after a newline, which is dropped."""
    ids = target.tokenize(text, add_bos=False, special=False)
    if b"".join(map(target.token_bytes, ids)) == text.encode("utf-8"):
        return ids
    lead = target.tokenize("\n", add_bos=False, special=False)
    after = target.tokenize("\n" + text, add_bos=False, special=False)
    return after[len(lead):] if after[:len(lead)] == lead else ids


class Grammar:
    """A grammar a reply must follow, in llguidance's terms.

    Make one with :meth:`json_schema`, :meth:`json_object`, :meth:`regex` or
    :meth:`lark`; a bad grammar raises ``ValueError`` saying why. One reply at a
    time: :meth:`start` resets it.
    """

    def __init__(self, source: str, description: str):
        import llguidance
        try:
            failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(source)
        except Exception as exc:  # noqa: BLE001 - llguidance's own error, said plainly
            failed, messages = True, [str(exc)]
        if failed:
            raise ValueError(f"invalid {description}: {messages[0] if messages else 'refused'}")
        self.source, self.description = source, description
        self._matcher = None
        self._consumed = 0  # tokens of the reply the matcher has taken

    @classmethod
    def json_schema(cls, schema: dict, *, strict: bool = False) -> "Grammar":
        """Output that is JSON matching ``schema``. ``strict``: OpenAI's strict mode
        (no properties beyond those listed)."""
        import llguidance
        if not isinstance(schema, dict):
            raise ValueError("invalid json_schema: the schema must be a JSON object")
        options = {"whitespace_flexible": False}
        if not strict:
            options["lenient"] = True
        else:
            schema = closed(schema)
        try:
            source = llguidance.grammar_from("json_schema", json.dumps({**schema, "x-guidance": options}))
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"invalid json_schema: {exc}") from None
        return cls(source, "json_schema")

    @classmethod
    def json_object(cls) -> "Grammar":
        """Output that is one JSON object (any)."""
        return cls.json_schema({"type": "object"})

    @classmethod
    def regex(cls, pattern: str) -> "Grammar":
        """Output that matches the regular expression ``pattern``."""
        import llguidance
        return cls(llguidance.grammar_from("regex", pattern), "regex")

    @classmethod
    def lark(cls, grammar: str) -> "Grammar":
        """Output that the Lark grammar ``grammar`` derives (llguidance's Lark dialect)."""
        import llguidance
        return cls(llguidance.grammar_from("lark", grammar), "grammar")

    @classmethod
    def gbnf(cls, grammar: str) -> "Grammar":
        """Output that the GBNF grammar ``grammar`` (llama.cpp's) derives."""
        from llguidance.gbnf_to_lark import gbnf_to_lark
        try:
            return cls.lark(gbnf_to_lark(grammar))
        except Exception as exc:  # noqa: BLE001 - the converter's or llguidance's message, said plainly
            why = (str(exc).strip() or type(exc).__name__).splitlines()[0]
            raise ValueError(f"not a usable GBNF grammar ({why})") from None

    # -- a TokenRule --------------------------------------------------------------------

    def start(self, target) -> None:
        """A fresh matcher over ``target``'s vocabulary."""
        import llguidance
        self._matcher = llguidance.LLMatcher(tokenizer_of(target), self.source, log_level=0)
        self._eos = target.vocab.eos_token_ids
        self._kept = None  # (tokens consumed, drafts, their masks) from admissible()
        self._consumed = 0
        self._check()

    def sync(self, generated: Sequence[int]) -> None:
        """Take the committed tokens the matcher has not seen yet."""
        fresh = list(generated[self._consumed:])
        if fresh:
            self._matcher.consume_tokens(fresh)
            self._consumed = len(generated)
            self._check()

    def admissible(self, drafts: Sequence[int]) -> int:
        """How many leading drafts the grammar allows: each checked against the mask of
        its row (an end token where the grammar may end counts; nothing after it is
        ever committed). The masks are kept for :meth:`masks`, which the same round
        asks for next. (llguidance's own ``validate_tokens`` refused tokens its mask
        allowed, e.g. the newline a tool call's template puts after ``<tool_call>``.)"""
        drafts = [int(t) for t in drafts]
        masks = self._walk(drafts, stop_at_refused=True)
        valid = len(masks) - 1
        if valid < len(drafts) and drafts[valid] in self._eos and masks[valid][drafts[valid]]:
            valid += 1
        self._kept = (self._consumed, drafts[:valid], masks)
        return valid

    def masks(self, drafts: Sequence[int], vocab_size: int) -> np.ndarray:
        """The allowed tokens after the reply and each prefix of ``drafts`` (which
        :meth:`admissible` allowed). A row after an end token is never sampled from
        (the reply ends there): it allows anything."""
        drafts = [int(t) for t in drafts]
        consumed, allowed, masks = self._kept or (None, None, None)
        if consumed == self._consumed and allowed[:len(drafts)] == drafts and len(masks) > len(drafts):
            rows = masks[:len(drafts) + 1]
        else:
            rows = self._walk(drafts, stop_at_refused=False)
        out = np.ones((len(drafts) + 1, vocab_size), dtype=bool)
        for i, row in enumerate(rows):
            known = min(vocab_size, len(row))
            out[i, :known] = row[:known]
            out[i, known:] = False  # (a drafter's ids beyond the grammar's vocabulary)
        return out

    def _walk(self, drafts: list[int], *, stop_at_refused: bool) -> list[np.ndarray]:
        """The mask of each row along ``drafts`` (the matcher rolled back afterwards):
        up to the first draft the grammar refuses (its row included) or an end token."""
        matcher, rows, taken = self._matcher, [], 0
        try:
            if matcher.is_stopped():
                return [self._mask()]
            for i in range(len(drafts) + 1):
                rows.append(self._mask())
                if i == len(drafts) or drafts[i] in self._eos:
                    break
                if stop_at_refused and not rows[-1][drafts[i]]:
                    break
                if not matcher.consume_token(drafts[i]):
                    raise ValueError(f"a draft the grammar refuses reached verification "
                                     f"({matcher.get_error()})")
                taken += 1
        finally:
            if taken:
                matcher.rollback(taken)
        return rows

    def _mask(self) -> np.ndarray:
        bits = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
        return np.unpackbits(bits, bitorder="little").astype(bool)

    def _check(self) -> None:
        if self._matcher.is_error():
            raise ValueError(f"the {self.description} failed: {self._matcher.get_error()}")
