"""Chat templates: messages -> prompt text, rendered in a sandbox.

A model's template comes from its own file (GGUF metadata or tokenizer_config.json), so it is
untrusted code: it runs in Jinja's immutable sandbox, which blocks attribute access to Python
internals (the hole behind llama-cpp-python's CVE-2024-34359).

Fallback, for models that carry no template: Gemma-family architectures get Gemma's turn format
(`<start_of_turn>user ... <end_of_turn>`), everything else ChatML (`<|im_start|>role ... <|im_end|>`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib.resources import files
from typing import Literal, NoReturn

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from localchat.errors import LocalchatError

Role = Literal["system", "user", "assistant"]

FALLBACK_TEMPLATES: dict[str, str] = {
    "gemma": "gemma.jinja",
    "gemma2": "gemma.jinja",
    "gemma3": "gemma.jinja",
    "gemma3n": "gemma.jinja",
}
DEFAULT_FALLBACK = "chatml.jinja"


@dataclass(frozen=True)
class Message:
    role: Role
    content: str


class TemplateError(LocalchatError):
    """A chat template that fails to parse or render."""


def _raise_exception(message: str) -> NoReturn:
    raise TemplateError(f"the chat template refused the conversation: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def fallback_template(architecture: str) -> str:
    name = FALLBACK_TEMPLATES.get(architecture, DEFAULT_FALLBACK)
    return files("localchat.assets").joinpath("templates", name).read_text(encoding="utf-8")


class ChatTemplate:
    """A compiled chat template with the model's BOS/EOS text."""

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "", origin: str = "model") -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
        env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as error:
            raise TemplateError(f"the {origin} chat template does not parse: {error}") from error
        self.source = source
        self.origin = origin
        self.bos_token = bos_token
        self.eos_token = eos_token

    @classmethod
    def for_model(cls, template: str | None, architecture: str, *, bos_token: str, eos_token: str) -> ChatTemplate:
        """The model's own template, or the documented fallback when it has none."""
        if template:
            return cls(template, bos_token=bos_token, eos_token=eos_token, origin="model")
        return cls(
            fallback_template(architecture),
            bos_token=bos_token,
            eos_token=eos_token,
            origin=f"fallback ({FALLBACK_TEMPLATES.get(architecture, DEFAULT_FALLBACK)})",
        )

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool = True) -> str:
        try:
            return self._template.render(
                messages=[{"role": m.role, "content": m.content} for m in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except TemplateError:
            raise
        except jinja2.exceptions.SecurityError as error:
            raise TemplateError(f"the {self.origin} chat template tried something unsafe: {error}") from error
        except (jinja2.TemplateError, TypeError, ValueError, KeyError) as error:
            raise TemplateError(f"the {self.origin} chat template failed to render: {error}") from error
