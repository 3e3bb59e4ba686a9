"""Rendering a model's Jinja chat template, as Hugging Face transformers does."""

from __future__ import annotations

from datetime import datetime

# ChatML, for models whose files carry no template.
DEFAULT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


# llama.cpp's --chat-template names that edgespec knows, as Jinja (a model's own
# template is what a GGUF file or an mlx-lm folder carries; these replace it).
NAMED_TEMPLATES = {
    "chatml": DEFAULT_TEMPLATE,
    "llama3": (
        "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}"
        "<|end_header_id|>\n\n{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
        "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"),
    "gemma": (  # (no system role: a system message is a turn of the user's)
        "{{ bos_token }}{% for message in messages %}<start_of_turn>"
        "{{ 'model' if message['role'] == 'assistant' else 'user' }}\n"
        "{{ message['content'] | trim }}<end_of_turn>\n{% endfor %}"
        "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"),
    "phi3": (
        "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"),
    "zephyr": (
        "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
        "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"),
}


def chat_template_from(value: str, flag: str = "--chat-template") -> str:
    """``--chat-template``'s value as Jinja: a name of :data:`NAMED_TEMPLATES`, or a
    Jinja template itself (as llama.cpp takes either); anything else is refused, by
    ``flag``'s name."""
    from ..errors import EdgespecError
    import jinja2

    if value in NAMED_TEMPLATES:
        return NAMED_TEMPLATES[value]
    if "{{" not in value and "{%" not in value:
        raise EdgespecError(f"unknown chat template {value!r} ({flag}): give one of "
                            f"{', '.join(NAMED_TEMPLATES)}, a Jinja template, or "
                            f"--chat-template-file FILE")
    try:
        _bounded_sandbox(DEFAULT_MAX_CHARS).parse(value)
    except jinja2.TemplateSyntaxError as exc:
        raise EdgespecError(f"{flag} is not valid Jinja (line {exc.lineno}: {exc.message})") from None
    return value


def render_chat_template(template: str | None, messages: list[dict], *,
                         add_generation_prompt: bool = True, bos_token: str = "",
                         eos_token: str = "", max_chars: int | None = None,
                         tools: list[dict] | None = None) -> str:
    """Render ``messages`` (dicts with ``role`` and ``content``) to a prompt string.
    ``tools``: OpenAI-style tool definitions, for templates with a tools section.

    The template is someone else's code: it runs sandboxed, a result longer
    than ``max_chars`` (what the context could hold) stops it as soon as it
    is produced, and whatever it raises becomes a clear error.
    """
    import jinja2

    from ..errors import EdgespecError

    limit = max_chars if max_chars is not None else DEFAULT_MAX_CHARS
    env = _bounded_sandbox(limit)
    try:
        pieces, length = [], 0
        for piece in env.from_string(template or DEFAULT_TEMPLATE).generate(
                messages=messages, add_generation_prompt=add_generation_prompt,
                bos_token=bos_token, eos_token=eos_token, **({"tools": tools} if tools else {})):
            length += len(piece)
            if length > limit:
                raise _TooLong()
            pieces.append(piece)
        return "".join(pieces)
    except _TooLong:
        raise EdgespecError(f"the chat template's output is over {limit:,} characters, more than the "
                            f"context can hold: shorten the conversation, or raise --ctx") from None
    except (jinja2.TemplateError, ArithmeticError, TypeError, ValueError, LookupError,
            AttributeError, RecursionError) as exc:
        raise EdgespecError(f"the chat template (the model's, or --chat-template's) failed on these messages "
                            f"({type(exc).__name__}: {exc})") from None


def template_has_tools(template: str | None) -> bool:
    """Whether a chat template renders tool definitions (Qwen2.5's, Llama 3.1's ...)."""
    return bool(template) and "tools" in template


# Without a context to bound it (a caller that gives no max_chars), no chat template
# needs more than this.
DEFAULT_MAX_CHARS = 1 << 24


class _TooLong(Exception):
    pass


def _bounded_sandbox(limit: int):
    """Jinja's immutable sandbox, where ``'ab' * 25000000`` and ``9 ** 9 ** 9``
    are refused before they are computed."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Bounded(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**"})

        def call_binop(self, context, operator, left, right):
            if operator == "*":
                for seq, times in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(times, int) \
                            and len(seq) * times > limit:
                        raise _TooLong()
            elif isinstance(right, (int, float)) and abs(right) > 64 \
                    and isinstance(left, (int, float)) and abs(left) > 1:
                raise jinja2.exceptions.SecurityError(f"{left} ** {right} is too large")
            return super().call_binop(context, operator, left, right)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = Bounded(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env
