"""Every request field the server knows, on each route, and what it does with it:
honoured, refused with a 400 naming it, or accepted without effect because it
cannot change the reply. docs/api.md shows this table (``python -m
edgespec.serve.request_fields`` prints it); the server reads it before a body's
fields are parsed: a refused field that is not switched off is a 400, and a field
outside the table is accepted and its name logged once, as a warning, so that
nothing silently changes meaning.

The routes: ``chat`` is ``/v1/chat/completions``, ``completions`` is
``/v1/completions`` and ``native`` is llama-server's ``/completion``. llama-server
takes its own sampling fields on every route (it passes a chat body's unknown
keys on to its sampler), and so does edgespec.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass

from .errors import ApiError
from .metrics import log

HONOURED, REFUSED, NO_EFFECT = "honoured", "refused", "no effect"
CHAT, COMPLETIONS, NATIVE = "chat", "completions", "native"
ROUTES = (CHAT, COMPLETIONS, NATIVE)
OPENAI = (CHAT, COMPLETIONS)
EXACT = "exact speculative decoding samples the model's own distribution, and "


@dataclass(frozen=True)
class Row:
    """One field: where it is read, what happens to it, and why.

    ``off``: for a refused field, the values that switch it off and so are
    accepted (clients that fill in every field send those)."""

    name: str
    routes: tuple[str, ...]
    status: str
    note: str
    off: tuple = ()


def _rows() -> list[Row]:
    H, R, N = HONOURED, REFUSED, NO_EFFECT
    return [
        # -- what to complete, and how much
        Row("messages", (CHAT,), H, "the conversation, through the model's chat template (text parts)"),
        Row("prompt", (COMPLETIONS, NATIVE), H, "text or token ids (one prompt)"),
        Row("model", ROUTES, H, "must name the served model (or an alias)"),
        Row("max_tokens", ROUTES, H, "the reply's limit (none: until the context is full)"),
        Row("max_completion_tokens", ROUTES, H, "the same as max_tokens"),
        Row("n_predict", (NATIVE,), H, "llama-server's max_tokens (-1: no limit)"),
        Row("stop", ROUTES, H, "up to 4 strings (64 on /completion), cut from the reply"),
        Row("stream", ROUTES, H, "server-sent events"),
        Row("stream_options", ROUTES, H, "include_usage: a last chunk with the usage"),
        Row("n", ROUTES, R, "one reply per request: send the request again for another", (1,)),
        Row("n_cmpl", (NATIVE,), R, "one reply per request: send the request again for another", (1,)),
        Row("best_of", (COMPLETIONS,), R, "one reply per request: send the request again", (1,)),
        Row("echo", (COMPLETIONS,), R, "the reply does not repeat the prompt", (False,)),
        Row("suffix", (COMPLETIONS,), R, "insertion (fill in the middle) is not supported", ("",)),
        # -- sampling
        Row("temperature", ROUTES, H, "0 is greedy"),
        Row("top_p", ROUTES, H, "after temperature (see samplers)"),
        Row("top_k", ROUTES, H, "0 is off"),
        Row("min_p", ROUTES, H, "after temperature (see samplers)"),
        Row("typical_p", ROUTES, H, "locally typical sampling, llama.cpp's typ_p; 1 is off"),
        Row("seed", ROUTES, H, "a seed gives one text whatever the drafter (seed-invariant sampling)"),
        Row("samplers", ROUTES, H, "as llama-server reads it: a stage left out is not applied, "
            "temperature before or after the filters; an order that is another distribution "
            "(filters as other than top_k, typ_p, top_p, min_p) is refused"),
        Row("logit_bias", ROUTES, H, "token id -> -100..100, OpenAI's object form"),
        Row("presence_penalty", ROUTES, H, "OpenAI's: over the reply so far (llama-server counts "
            "the last repeat_last_n tokens, prompt included)"),
        Row("frequency_penalty", ROUTES, H, "OpenAI's: over the reply so far (as presence_penalty)"),
        Row("repeat_penalty", ROUTES, H, "llama.cpp's: tokens among the last repeat_last_n of the "
            "context, prompt included; 1 is off"),
        Row("repeat_last_n", ROUTES, H, "repeat_penalty's window (default 64; 0 is off)"),
        Row("penalize_nl", (NATIVE,), N, "llama.cpp removed it: a newline is penalised like any token"),
        Row("mirostat", ROUTES, R, EXACT + "mirostat keeps state across tokens that a rejected "
            "draft would have to roll back", (0,)),
        Row("mirostat_tau", ROUTES, N, "read only with mirostat"),
        Row("mirostat_eta", ROUTES, N, "read only with mirostat"),
        Row("xtc_probability", ROUTES, R, EXACT + "XTC draws random numbers of its own", (0, 0.0)),
        Row("xtc_threshold", ROUTES, N, "read only with xtc_probability"),
        Row("dry_multiplier", ROUTES, R, "DRY is not supported yet", (0, 0.0)),
        Row("dry_base", ROUTES, N, "read only with dry_multiplier"),
        Row("dry_allowed_length", ROUTES, N, "read only with dry_multiplier"),
        Row("dry_penalty_last_n", ROUTES, N, "read only with dry_multiplier"),
        Row("dry_sequence_breakers", ROUTES, N, "read only with dry_multiplier"),
        Row("top_n_sigma", ROUTES, R, "not supported", (-1, -1.0)),
        Row("dynatemp_range", ROUTES, R, "dynamic temperature is not supported", (0, 0.0)),
        Row("dynatemp_exponent", ROUTES, N, "read only with dynatemp_range"),
        Row("tfs_z", ROUTES, R, "tail-free sampling is not supported (llama.cpp removed it)", (1, 1.0)),
        Row("min_keep", ROUTES, R, "not supported: filters keep what they keep", (0,)),
        Row("ignore_eos", ROUTES, R, "not supported: set max_tokens and a stop instead", (False,)),
        Row("adaptive_target", ROUTES, R, "adaptive-p sampling is not supported", (-1, -1.0)),
        Row("adaptive_decay", ROUTES, N, "read only with adaptive_target"),
        # -- the shape of the reply
        Row("response_format", ROUTES, H, "text, json_object or json_schema (a grammar)"),
        Row("grammar", ROUTES, H, "a GBNF grammar (converted for llguidance)"),
        Row("json_schema", ROUTES, H, "a JSON schema the reply follows"),
        Row("tools", (CHAT,), H, "through the model's chat template"),
        Row("tools", (COMPLETIONS, NATIVE), R, "a completion has no chat template to give tools to: use chat"),
        Row("tool_choice", (CHAT,), H, "auto, none, required or a named function (a grammar)"),
        Row("tool_choice", (COMPLETIONS, NATIVE), R, "a completion has no tools: use chat", ("none", "auto")),
        Row("parallel_tool_calls", (CHAT,), H, "false: at most one call (true, the default: several); "
            "with tool_choice auto, the reply's first call is the one returned"),
        Row("parallel_tool_calls", (COMPLETIONS, NATIVE), N, "a completion has no tools"),
        Row("prediction", ROUTES, H, "Predicted Outputs: drafted from"),
        Row("logprobs", ROUTES, H, "chat: true/false; completions and /completion: 0..5 alternatives"),
        Row("top_logprobs", (CHAT,), H, "0..20 alternatives, with logprobs: true"),
        Row("top_logprobs", (COMPLETIONS, NATIVE), N, "the legacy logprobs (an integer) asks for alternatives"),
        Row("n_probs", (NATIVE,), H, "completion_probabilities: each token's logprob and the top n"),
        Row("n_probs", OPENAI, N, "logprobs and top_logprobs ask for them on this route"),
        Row("post_sampling_probs", (NATIVE,), R, "probabilities are the model's, before sampling",
            (False,)),
        Row("return_tokens", (NATIVE,), H, "the reply's token ids"),
        Row("speculative", ROUTES, H, "edgespec's: {drafter, num_draft}"),
        Row("speculative.n_max", ROUTES, H, "llama-server's: the most tokens a draft has (num_draft)"),
        Row("speculative.n_min", ROUTES, N, "drafts are as long as the planner finds best"),
        Row("speculative.p_min", ROUTES, N, "drafts are as long as the planner finds best"),
        Row("cache_prompt", ROUTES, H, "false: the whole prompt is evaluated again, nothing cached reused"),
        # -- what cannot change the reply
        Row("user", OPENAI, N, "an end user's id: nothing to do with the reply"),
        Row("metadata", OPENAI, N, "stored completions are not kept"),
        Row("store", OPENAI, N, "stored completions are not kept"),
        Row("service_tier", OPENAI, N, "one tier"),
        Row("prompt_cache_key", OPENAI, N, "the prompt cache finds prefixes by itself"),
        Row("safety_identifier", OPENAI, N, "an end user's id: nothing to do with the reply"),
        Row("id_slot", (NATIVE,), N, "one slot"),
        Row("n_keep", (NATIVE,), N, "the context is never shifted: a full context ends the reply"),
        Row("timings_per_token", (NATIVE,), N, "every reply carries its timings"),
        Row("return_progress", ROUTES, H, "streamed: prompt_progress events (total, cache, processed, "
            "time_ms) while the prompt is processed, as llama-server sends them"),
        Row("t_max_predict_ms", (NATIVE,), R, "not supported: use n_predict", (-1, 0)),
        Row("n_indent", (NATIVE,), R, "not supported", (0,)),
        Row("lora", (NATIVE,), R, "LoRA adapters are not supported", ([],)),
        Row("response_fields", (NATIVE,), R, "not supported: the whole result is sent", ([],)),
        # -- chat only
        Row("modalities", (CHAT,), R, "text only", (["text"],)),
        Row("audio", (CHAT,), R, "text only"),
        Row("functions", (CHAT,), R, "the legacy functions field: send tools"),
        Row("function_call", (CHAT,), R, "the legacy function_call field: send tool_choice"),
        Row("reasoning_effort", (CHAT,), R, "not supported: it would change a reasoning model's reply"),
        Row("verbosity", (CHAT,), R, "not supported"),
        Row("web_search_options", (CHAT,), R, "no web search"),
        Row("chat_template_kwargs", (CHAT,), R, "not supported: the template is rendered as it is",
            ({},)),
    ]


FIELDS: list[Row] = _rows()
_BY_ROUTE = {route: {row.name: row for row in FIELDS if route in row.routes} for route in ROUTES}
_warned: set[str] = set()  # the unknown fields logged so far
MAX_WARNED = 256
_warned_lock = threading.Lock()


def row(route: str, name: str) -> Row | None:
    """The table's row for ``name`` on ``route`` (None: not in the table)."""
    return _BY_ROUTE[route].get(name)


def check(route: str, body) -> None:
    """Refuse (400) a refused field that is not switched off; log once each field the
    table does not have."""
    if not isinstance(body, dict):
        return
    for name, value in body.items():
        found = row(route, name)
        if found is None:
            with _warned_lock:  # (a bounded memory: a client that invents names cannot grow it)
                first = name not in _warned and len(_warned) < MAX_WARNED
                if first:
                    _warned.add(name)
            if first:
                log.warning("a request has the field %r, which this server does not know: it was "
                            "accepted and has no effect (docs/api.md lists the fields it reads)", name)
        elif found.status == REFUSED and value is not None and not _is_off(value, found.off):
            raise ApiError(400, f"{name} is not supported: {found.note}", param=name)


def _is_off(value, off: tuple) -> bool:
    """Whether ``value`` is one of ``off`` (true is not 1 here, nor 1 true)."""
    def alike(o) -> bool:
        numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (value, o))
        return type(value) is type(o) or numbers
    return any(alike(o) and value == o for o in off)


def markdown() -> str:
    """The table as docs/api.md shows it."""
    names = {CHAT: "chat", COMPLETIONS: "completions", NATIVE: "/completion"}
    lines = ["| field | routes | | what edgespec does |", "|---|---|---|---|"]
    for r in FIELDS:
        routes = "all" if r.routes == ROUTES else ", ".join(names[x] for x in r.routes)
        lines.append(f"| `{r.name}` | {routes} | {r.status} | {r.note} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(markdown() + "\n")
