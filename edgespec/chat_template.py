"""Rendering a model's Jinja chat template, as Hugging Face transformers does."""

from __future__ import annotations

from datetime import datetime

# ChatML, for models whose files carry no template.
DEFAULT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def render_chat_template(template: str | None, messages: list[dict], *,
                         add_generation_prompt: bool = True, bos_token: str = "",
                         eos_token: str = "") -> str:
    """Render ``messages`` (dicts with ``role`` and ``content``) to a prompt string."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template or DEFAULT_TEMPLATE).render(
        messages=messages, add_generation_prompt=add_generation_prompt,
        bos_token=bos_token, eos_token=eos_token)
