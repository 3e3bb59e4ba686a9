"""llama-server's native wire format: ``/completion``, ``/tokenize``, ``/detokenize``, ``/props``.

No web framework here: :mod:`edgespec.serve.native_routes` moves these dicts over HTTP.
Field names and shapes follow llama.cpp's ``tools/server`` (its README and
``server.cpp``), so clients written for llama-server (Continue's llama.cpp
provider, Zed's, web pages that read ``/props``) work unchanged. A native request
is checked by the OpenAI parser (:func:`~edgespec.serve.openai_api.parse_request`) once
its llama-server names are mapped to OpenAI's; what is llama-server's own is
checked here. Sampling that would change the model's distribution (mirostat,
repetition penalties, grammars) is refused with a 400 rather than ignored, as on
the OpenAI endpoints.
"""

from __future__ import annotations

import dataclasses
from importlib import metadata

from ..drafters import registry
from ..drafters.registry import BUILTIN
from ..errors import EdgespecError
from .openai_api import ApiError, Request, parse_request, timings
from ..core.prompting import check_prompt_chars
from ..core.sampling import SamplingParams
from ..core.stats import GenerationStats

# llama-server's sampling options edgespec does not have, each with the value that
# switches it off (sent as is by clients that fill in every field): any other is a 400.
NEUTRAL = {"mirostat": 0, "repeat_penalty": 1.0, "typical_p": 1.0, "tfs_z": 1.0,
           "xtc_probability": 0.0, "dry_multiplier": 0.0, "top_n_sigma": -1.0, "n_probs": 0,
           "ignore_eos": False, "grammar": "", "json_schema": None, "dynatemp_range": 0.0}
# Fields llama-server takes that change nothing here (the cache is always reused,
# exactly; there is one slot), checked only for their type.
FLAGS = ("cache_prompt", "return_tokens", "timings_per_token")
MAX_STOPS = 64  # llama-server has no limit; a generous one keeps the matching cheap


def parse_completion(body, defaults: SamplingParams) -> tuple[Request, bool]:
    """A ``POST /completion`` body as a :class:`Request` (kind "completion"), and
    whether the response lists the token ids (``return_tokens``)."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    for name, neutral in NEUTRAL.items():
        value = body.get(name)
        if value is not None and value != neutral and not (neutral is None and value == {}):
            raise ApiError(400, f"{name} is not supported: exact speculative decoding samples "
                                f"the model's own distribution", param=name)
    for name in FLAGS:
        if not isinstance(body.get(name, False), bool):
            raise ApiError(400, f"{name} must be true or false", param=name)
    openai = {key: value for key, value in body.items() if key not in ("n_predict", "stop", "seed")}
    n_predict = body.get("n_predict")
    if n_predict is not None:
        if isinstance(n_predict, bool) or not isinstance(n_predict, int) or \
                not (n_predict == -1 or n_predict >= 1):
            raise ApiError(400, f"invalid n_predict={n_predict!r}: must be an integer >= 1, "
                                f"or -1 for no limit", param="n_predict")
        openai["max_tokens"] = None if n_predict == -1 else n_predict
    elif body.get("max_tokens") == -1:
        openai["max_tokens"] = None
    if body.get("seed") != -1:  # -1: a random seed, as in llama-server
        openai["seed"] = body.get("seed")
    request = parse_request(openai, "completion", defaults)
    return dataclasses.replace(request, stop=_stops(body.get("stop"))), \
        bool(body.get("return_tokens", False))


def _stops(stop) -> list[str]:
    """llama-server's ``stop``: a list of strings (any number, up to :data:`MAX_STOPS`)."""
    if stop is None:
        return []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > MAX_STOPS or \
            not all(isinstance(s, str) and s for s in stop):
        raise ApiError(400, f"stop must be a list of up to {MAX_STOPS} non-empty strings",
                       param="stop")
    return stop


def parse_tokenize(body) -> tuple[str, bool, bool, bool]:
    """``POST /tokenize``: (content, add_special, parse_special, with_pieces)."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    content = body.get("content")
    if not isinstance(content, str):
        raise ApiError(400, "content must be a string (the text to tokenize)", param="content")
    flags = []
    for name, default in (("add_special", False), ("parse_special", True), ("with_pieces", False)):
        value = body.get(name, default)
        if not isinstance(value, bool):
            raise ApiError(400, f"{name} must be true or false", param=name)
        flags.append(value)
    return (content, *flags)


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


def parse_detokenize(body, vocab_size: int) -> list[int]:
    """``POST /detokenize``: the token ids, each within the vocabulary."""
    tokens = body.get("tokens") if isinstance(body, dict) else None
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                               and 0 <= t < vocab_size for t in tokens):
        raise ApiError(400, f"tokens must be a list of token ids (0 .. {vocab_size - 1})",
                       param="tokens")
    return tokens


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


def generation_settings(params: SamplingParams, max_tokens: int | None, stop: list[str],
                        stream: bool, drafter: str, num_draft: int | str) -> dict:
    """llama-server's ``params``: what a generation runs with (-1: none / no limit)."""
    return {"seed": -1 if params.seed is None else params.seed,
            "temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p,
            "min_p": params.min_p, "n_predict": -1 if max_tokens is None else max_tokens,
            "max_tokens": -1 if max_tokens is None else max_tokens, "stop": stop,
            "stream": stream, "n_probs": 0, "repeat_penalty": 1.0, "presence_penalty": 0.0,
            "frequency_penalty": 0.0, "mirostat": 0, "typical_p": 1.0,
            "samplers": ["top_k", "top_p", "min_p", "temperature"],
            "speculative.n_max": num_draft if isinstance(num_draft, int) else -1,
            "speculative": {"drafter": drafter, "num_draft": num_draft}}


def completion_chunk(text: str, token_ids: list[int], predicted: int, from_draft: bool) -> dict:
    """One streamed piece of a ``/completion`` (llama-server's partial result), with
    edgespec's ``from_draft``."""
    return {"index": 0, "content": text, "tokens": token_ids, "stop": False, "id_slot": 0,
            "tokens_predicted": predicted, "from_draft": from_draft}


def completion(model: str, text: str, token_ids: list[int], stats: GenerationStats,
               stop: tuple[str, str], settings: dict, prompt, *, streamed: bool) -> dict:
    """A finished ``/completion`` (llama-server's final result; ``streamed``, it is the
    last event, its text and tokens already sent)."""
    return {"index": 0, "content": "" if streamed else text,
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
