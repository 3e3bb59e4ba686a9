"""llama-server's native wire format: ``/completion``, ``/tokenize``, ``/detokenize``, ``/props``.

No web framework here: :mod:`edgespec.serve.native_routes` moves these over HTTP.
Field names and shapes follow llama.cpp's ``tools/server`` (its README and
``server.cpp``), so clients written for llama-server (Continue's llama.cpp
provider, Zed's, web pages that read ``/props``) work unchanged. A ``/completion``
body is an OpenAI completions body (:class:`~edgespec.serve.openai_api.CompletionBody`)
in llama-server's names, with llama-server's own fields checked first. Which fields
are honoured and which refused (mirostat, XTC, ...) is
:mod:`edgespec.serve.request_fields`'s table, as on the OpenAI endpoints.
"""

from __future__ import annotations

from importlib import metadata
from typing import Annotated

from pydantic import (AliasChoices, BaseModel, BeforeValidator, Field, PlainValidator,
                      StrictBool, StrictInt, StrictStr, create_model)

from ..drafters import registry
from ..drafters.registry import BUILTIN
from ..errors import EdgespecError
from .errors import ApiError, invalid
from .openai_api import CompletionBody, Request, Sampling, progress, timings
from .logprobs import token_entries
from .sampler_order import applied_samplers
from ..core.shaping import Shaping
from ..core.prompting import check_prompt_chars
from ..core.sampling import SamplingParams
from ..core.stats import GenerationStats

# Fields llama-server takes that shape the reply's JSON, checked for their type.
FLAGS = ("return_tokens", "timings_per_token")
MAX_N_PROBS = 20  # (as top_logprobs)
MAX_STOPS = 64  # llama-server has no limit; a generous one keeps the matching cheap


def _n_predict(n):
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not (n == -1 or n >= 1)):
        raise invalid(f"invalid n_predict={n!r}: must be an integer >= 1, or -1 for no limit", "n_predict")
    return n


def _stops(stop) -> list[str]:
    """llama-server's ``stop``: a list of strings (any number, up to :data:`MAX_STOPS`)."""
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > MAX_STOPS or \
            not all(isinstance(s, str) and s for s in stop):
        raise invalid(f"must be a list of up to {MAX_STOPS} non-empty strings")
    return stop


def _unlimited(max_tokens, info):
    return None if max_tokens == -1 or info.data.get("n_predict") is not None else max_tokens


# llama-server's own fields: the flags, n_predict and n_probs.
_Native = create_model("_Native", **{name: (StrictBool, False) for name in FLAGS},
                       n_predict=(Annotated[int | None, PlainValidator(_n_predict)], None),
                       n_probs=(Annotated[StrictInt, Field(ge=0, le=MAX_N_PROBS)], 0))


class NativeCompletion(CompletionBody, _Native):
    """A ``POST /completion`` body. Its bases are ordered so that llama-server's own
    fields are checked first (see :mod:`~edgespec.serve.openai_api`); ``-1`` means no
    limit for ``n_predict`` (which wins over ``max_tokens``) and a random ``seed``."""

    max_tokens: Annotated[Annotated[StrictInt, Field(ge=1)] | None, BeforeValidator(_unlimited)] = Field(
        None, validation_alias=AliasChoices("max_completion_tokens", "max_tokens"))
    seed: Annotated[Sampling, BeforeValidator(lambda seed: None if seed == -1 else seed)] = None
    stop: Annotated[list[str], PlainValidator(_stops)] = []

    def asked_logprobs(self) -> int | None:
        """``n_probs``: each token's logprob and this many alternatives (0: none)."""
        return self.n_probs or super().asked_logprobs()

    def request(self, defaults: SamplingParams, penalties: dict | None = None) -> Request:
        """What this body asks for, sampling and penalties left unset taken from the
        server's ``defaults`` and ``penalties``."""
        request = super().request(defaults, penalties)
        if self.n_predict is not None:
            request.max_tokens = None if self.n_predict == -1 else self.n_predict
        return request


class TokenizeBody(BaseModel):
    """A ``POST /tokenize`` body."""

    content: StrictStr
    add_special: StrictBool = False
    parse_special: StrictBool = True
    with_pieces: StrictBool = False


def _token_ids(tokens, info) -> list[int]:
    vocab = info.context["vocab_size"]
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                               and 0 <= t < vocab for t in tokens):
        raise invalid(f"must be a list of token ids (0 .. {vocab - 1})")
    return tokens


class DetokenizeBody(BaseModel):
    """A ``POST /detokenize`` body: token ids, each within the vocabulary."""

    tokens: Annotated[list[int], PlainValidator(_token_ids)]


def tokenize(backend, content: str, add_special: bool, parse_special: bool) -> list[int]:
    """The token ids of ``content`` (a text too long for any context, or one the
    vocabulary cannot spell, is a 400)."""
    try:
        check_prompt_chars(content, backend)
        return backend.tokenize(content, add_bos=add_special, special=parse_special)
    except EdgespecError as exc:
        raise ApiError(400, str(exc), param="content") from None


def pieces(token_ids: list[int], token_bytes) -> list[dict]:
    """``with_pieces``: each id with its text, or its bytes where they are not UTF-8."""
    out = []
    for token in token_ids:
        raw = token_bytes(token)
        try:
            piece = raw.decode("utf-8")
        except UnicodeDecodeError:
            piece = list(raw)
        out.append({"id": token, "piece": piece})
    return out


def detokenize(token_ids: list[int], token_bytes) -> str:
    """The text of ``token_ids`` (an incomplete character at the end becomes U+FFFD)."""
    return b"".join(token_bytes(t) for t in token_ids).decode("utf-8", errors="replace")


# -- responses ------------------------------------------------------------------------------


def stop_type(reason: str, text: str, token_ids: list[int], stop: list[str],
              token_bytes) -> tuple[str, str]:
    """llama-server's ``stop_type`` ("eos", "word", "limit" or "none") and
    ``stopping_word``. A stop string cut the text where the tokens' own text goes
    on with it; otherwise a "stop" was the end token."""
    if reason == "length":
        return "limit", ""
    if reason != "stop":
        return "none", ""
    if stop:
        full = detokenize(token_ids, token_bytes)
        rest = full[len(text):] if full.startswith(text) else ""
        for word in sorted(stop, key=len, reverse=True):
            if rest.startswith(word):
                return "word", word
    return "eos", ""


def generation_settings(request: Request, drafter: str, num_draft: int | str) -> dict:
    """llama-server's ``params``: what a generation runs with, as applied (-1: none /
    no limit)."""
    params, max_tokens, shaping = request.params, request.max_tokens, request.extras.shaping
    shaping = shaping or Shaping()
    return {"seed": -1 if params.seed is None else params.seed,
            "temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p,
            "min_p": params.min_p, "typical_p": params.typical_p,
            "n_predict": -1 if max_tokens is None else max_tokens,
            "max_tokens": -1 if max_tokens is None else max_tokens, "stop": request.stop,
            "stream": request.stream, "n_probs": request.extras.logprobs or 0,
            "repeat_penalty": shaping.repeat_penalty, "repeat_last_n": shaping.repeat_last_n,
            "presence_penalty": shaping.presence_penalty, "frequency_penalty": shaping.frequency_penalty,
            "mirostat": 0, "cache_prompt": request.cache_prompt,
            "samplers": applied_samplers(params),
            "speculative.n_max": num_draft if isinstance(num_draft, int) else -1,
            "speculative": {"drafter": drafter, "num_draft": num_draft}}


def probabilities(entries: list[dict], token_bytes) -> list[dict]:
    """llama-server's ``completion_probabilities`` (``n_probs``): each token's id,
    text, bytes and logprob, with its ``top_logprobs``."""
    return token_entries(entries, token_bytes, ids=True)


def completion_chunk(text: str, token_ids: list[int], predicted: int, from_draft: bool,
                     probs: list[dict] | None = None) -> dict:
    """One streamed piece of a ``/completion`` (llama-server's partial result), with
    edgespec's ``from_draft``; ``probs``: its tokens' ``completion_probabilities``."""
    return {"index": 0, "content": text, "tokens": token_ids, "stop": False, "id_slot": 0,
            "tokens_predicted": predicted, "from_draft": from_draft,
            **({"completion_probabilities": probs} if probs is not None else {})}


def progress_chunk(prompt) -> dict:
    """A streamed ``/completion`` event that only says how far the prompt's processing
    has come (``return_progress``), as llama-server sends it."""
    return {"index": 0, "content": "", "tokens": [], "stop": False, "id_slot": 0,
            "tokens_predicted": 0, "tokens_evaluated": prompt.total, "prompt_progress": progress(prompt)}


def completion(model: str, text: str, token_ids: list[int], stats: GenerationStats,
               stop: tuple[str, str], settings: dict, prompt, *, streamed: bool,
               probs: list[dict] | None = None) -> dict:
    """A finished ``/completion`` (llama-server's final result; ``streamed``, it is the
    last event, its text and tokens already sent; ``probs``: the whole reply's
    ``completion_probabilities``, not streamed)."""
    return {**({"completion_probabilities": probs} if probs is not None and not streamed else {}),
            "index": 0, "content": "" if streamed else text,
            "tokens": [] if streamed else token_ids, "id_slot": 0, "stop": True,
            "model": model, "tokens_predicted": stats.generated_tokens,
            "tokens_evaluated": stats.prompt_tokens, "generation_settings": settings,
            "prompt": prompt, "has_new_line": "\n" in text, "truncated": False,
            "stop_type": stop[0], "stopping_word": stop[1],
            "tokens_cached": stats.prompt_tokens + stats.generated_tokens,
            "timings": timings(stats)}


def props(*, model: str, model_path: str, n_ctx: int, params: dict, busy: bool,
          chat_template: str, special: dict, speculative: dict) -> dict:
    """``GET /props``: llama-server's shape, plus edgespec's ``speculative``: the
    drafters a request may name, and what one that names none gets."""
    return {"default_generation_settings": {"id": 0, "n_ctx": n_ctx, "speculative": True,
                                            "is_processing": busy, "params": params},
            "total_slots": 1, "model_alias": model, "model_path": model_path, "n_ctx": n_ctx,
            "modalities": {"vision": False, "audio": False},
            "endpoint_slots": False, "endpoint_props": False, "endpoint_metrics": True,
            "webui": True, "chat_template": chat_template, **special,
            "build_info": f"edgespec {_version()}", "speculative": speculative}


def speculative(default_drafter: str, num_draft: int | str, draft_model: str | None) -> dict:
    """The drafters this server offers (``speculative.drafter`` values, described) and its
    defaults; ``num_draft`` takes an integer >= 1 or, ``num_draft_auto``, "auto"."""
    drafters = {name: text for name, (_, text) in BUILTIN.items()}
    if draft_model:
        drafters[registry.MODEL] = f"the draft model ({draft_model})"
    drafters[registry.OFF] = "no speculation: plain decoding"
    return {"drafters": drafters, "drafter": default_drafter, "num_draft": num_draft,
            "num_draft_auto": True, "draft_model": draft_model}


def special_tokens(backend) -> dict:
    """``bos_token`` and ``eos_token`` as llama-server spells them (where the model has them)."""
    found = {}
    specials = backend.vocab.special_token_ids
    for label in ("bos", "eos"):
        if label in specials:
            found[f"{label}_token"] = backend.token_bytes(specials[label]).decode("utf-8", "replace")
    return found


def chat_template_of(backend) -> str:
    """The model's own chat template source ("" where it has none)."""
    source = backend.chat_template()
    return source if isinstance(source, str) else ""


def _version() -> str:
    try:
        return metadata.version("edgespec")
    except metadata.PackageNotFoundError:
        return "unknown"
