"""A GGUF file's tokenizer, special tokens and chat template, through llama.cpp."""

from __future__ import annotations

import ctypes
import os

from ..errors import EdgespecError
from ..core.backend import VocabInfo, closed_error
from .llama_lib import VOCAB_KINDS, check_gguf_file, llama, load_model

class GGUFTokenizer:
    """A GGUF file's tokenizer, special tokens and chat template, through llama.cpp.

    The MLX backend uses it too for GGUF files, so both backends tokenize a
    GGUF model identically.
    """

    def __init__(self, model, *, owns_model: bool = False):
        self._model = model
        self._owns_model = owns_model
        self._vocab = llama.llama_model_get_vocab(model)
        self.vocab = self._read_vocab()
        self._unreadable = self._spm_without_byte_fallback()

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "GGUFTokenizer":
        """Load only the vocabulary of a GGUF file (no weights)."""
        return cls(load_model(check_gguf_file(path), vocab_only=True), owns_model=True)

    def _read_vocab(self) -> VocabInfo:
        v = self._vocab
        size = llama.llama_vocab_n_tokens(v)
        eog = frozenset(t for t in range(size) if llama.llama_vocab_is_eog(v, t))
        specials = {}
        for label, fn in (("bos", llama.llama_vocab_bos), ("eos", llama.llama_vocab_eos),
                          ("eot", llama.llama_vocab_eot), ("sep", llama.llama_vocab_sep),
                          ("nl", llama.llama_vocab_nl), ("pad", llama.llama_vocab_pad),
                          ("fim_pre", llama.llama_vocab_fim_pre),
                          ("fim_suf", llama.llama_vocab_fim_suf),
                          ("fim_mid", llama.llama_vocab_fim_mid)):
            token = fn(v)
            if token >= 0:
                specials[label] = int(token)
        bos = specials.get("bos") if llama.llama_vocab_get_add_bos(v) else None
        return VocabInfo(size=size, kind=VOCAB_KINDS.get(llama.llama_vocab_type(v), "?"),
                         bos_token_id=bos, eos_token_ids=eog, special_token_ids=specials)

    def _spm_without_byte_fallback(self) -> tuple[set[str], list[str]] | None:
        """For a SentencePiece vocabulary that lacks some of the 256 byte tokens:
        the characters it has tokens for, and its special tokens' texts.

        llama.cpp spells a character the vocabulary lacks as byte tokens, and
        aborts the process (``std::out_of_range``) where those are missing, so
        :meth:`tokenize` must refuse such text first. None: every text is safe.
        """
        if self.vocab.kind != "spm":
            return None
        v, byte_attr = self._vocab, llama.LLAMA_TOKEN_ATTR_BYTE
        special = llama.LLAMA_TOKEN_ATTR_CONTROL | llama.LLAMA_TOKEN_ATTR_USER_DEFINED
        texts = [(self.token_text(t), llama.llama_vocab_get_attr(v, t)) for t in range(self.vocab.size)]
        if {f"<0x{b:02X}>" for b in range(256)} <= {text for text, attr in texts if attr & byte_attr}:
            return None
        chars = {text for text, attr in texts if len(text) == 1 and not attr & special}
        return chars, [text for text, attr in texts if attr & special and text]

    def _check_spelled(self, text: str, special: bool) -> None:
        """Refuse ``text`` with a character this vocabulary can only spell in bytes it lacks."""
        chars, specials = self._unreadable
        if special:  # special tokens are cut out before the text is split into characters
            for piece in specials:
                text = text.replace(piece, "")
        for char in dict.fromkeys(text.replace(" ", "\u2581")):  # (in order: the first named)
            if char not in chars:
                raise EdgespecError(
                    f"this model's vocabulary has no token for {char!r} and no byte tokens to "
                    f"spell it with (a SentencePiece vocabulary without byte fallback): "
                    f"remove that character from the text, or use a model with a complete vocabulary")

    def _live(self):
        """The vocabulary pointer; after close() an error, not a read of freed memory."""
        if self._vocab is None:
            raise closed_error("the tokenizer")
        return self._vocab

    def token_text(self, token_id: int) -> str:
        """The vocabulary's stored text of a token (for compatibility checks)."""
        return llama.llama_vocab_get_text(self._live(), token_id).decode("utf-8", errors="replace")

    def tokenize(self, text: str, *, add_bos: bool = True, special: bool = True) -> list[int]:
        vocab = self._live()
        if self._unreadable:
            self._check_spelled(text, special)
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buffer = (llama.llama_token * capacity)()
        n = llama.llama_tokenize(vocab, data, len(data), buffer, capacity, add_bos, special)
        if n < 0:  # buffer too small: -n is the size needed
            capacity = -n
            buffer = (llama.llama_token * capacity)()
            n = llama.llama_tokenize(vocab, data, len(data), buffer, capacity, add_bos, special)
        return list(buffer[:n])

    def token_bytes(self, token_id: int) -> bytes:
        vocab = self._live()
        buffer = ctypes.create_string_buffer(64)
        n = llama.llama_token_to_piece(vocab, token_id, buffer, 64, 0, True)
        if n < 0:
            buffer = ctypes.create_string_buffer(-n)
            n = llama.llama_token_to_piece(vocab, token_id, buffer, -n, 0, True)
        return buffer.raw[:n]

    template: str | None = None  # --chat-template: used instead of the file's own

    def use_chat_template(self, template: str) -> None:
        """Render chats with ``template`` (Jinja) instead of the file's own."""
        self.template = template

    def chat_template(self) -> str | None:
        """The Jinja chat template in use: ``--chat-template``'s, else the one stored in
        the GGUF metadata, if any."""
        self._live()
        if self.template is not None:
            return self.template
        template = llama.llama_model_chat_template(self._model, None)
        return template.decode("utf-8") if template else None

    def apply_chat_template(self, messages: list[dict], *, add_generation_prompt: bool = True,
                            max_chars: int | None = None, tools: list[dict] | None = None) -> str:
        from ..core.chat_template import render_chat_template
        return render_chat_template(
            self.chat_template(), messages, add_generation_prompt=add_generation_prompt,
            bos_token=self._special_text("bos"), eos_token=self._special_text("eos"),
            max_chars=max_chars, tools=tools)

    def _special_text(self, label: str) -> str:
        token = self.vocab.special_token_ids.get(label)
        return self.token_text(token) if token is not None else ""

    def close(self) -> None:
        """Forget the model (and free it if this tokenizer loaded it); later calls raise."""
        self._vocab = None
        if self._owns_model and self._model:
            llama.llama_model_free(self._model)
        self._model = None
