"""Chat templates: messages -> prompt text, rendered the way Hugging Face transformers renders them.

A model's template comes from its own file (GGUF metadata or tokenizer_config.json), so it is
untrusted code: it runs in Jinja's immutable sandbox, which blocks attribute access to Python
internals (the hole behind llama-cpp-python's CVE-2024-34359).

Templates are written against transformers' `apply_chat_template`, so this module rebuilds its
environment (transformers.utils.chat_template_utils) without importing transformers: trim_blocks
and lstrip_blocks, `break`/`continue`, the `{% generation %}` block, a `tojson` that keeps
non-ASCII text and takes indent/separators, `raise_exception`, `strftime_now`, a `namespace` that
refuses underscore names, and Jinja's lenient Undefined (`{% if tools %}` without tools is false,
`message.tool_calls` on a plain message is undefined, not an error). The template sees the same
variables: messages, tools, documents, add_generation_prompt, bos_token/eos_token and any extra
keyword (`enable_thinking=False`), all rebuilt from plain JSON types first. `enable_thinking` also sets the
other thinking switch a template reads (THINKING_SWITCHES: Kimi K3's `thinking`, MiniMax-M3's `thinking_mode`).

Fallback, for models that carry no template: Gemma-family architectures get Gemma's turn format
(`<start_of_turn>user ... <end_of_turn>`), everything else ChatML (`<|im_start|>role ... <|im_end|>`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib.resources import files
from typing import Any, ClassVar, Literal, NoReturn

import jinja2
import jinja2.ext
import jinja2.meta
import numpy as np
from jinja2 import nodes
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from localchat.errors import LocalchatError

Role = Literal["system", "user", "assistant", "tool"]

FALLBACK_TEMPLATES: dict[str, str] = {
    "gemma": "gemma.jinja",
    "gemma2": "gemma.jinja",
    "gemma3": "gemma.jinja",
    "gemma3n": "gemma.jinja",
}
DEFAULT_FALLBACK = "chatml.jinja"
# The names a message's reasoning goes by; transformers fills the first (what most templates read)
# and "thinking" (what gpt-oss reads) from whichever one the caller set.
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


@dataclass(frozen=True)
class ToolCall:
    """A function call the assistant made. Arguments are an object, not OpenAI's JSON string:
    templates write them with `tojson`."""

    id: str
    name: str
    arguments: Mapping[str, Any]

    def as_template_dict(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": dict(self.arguments)}}


@dataclass(frozen=True)
class Message:
    """One message of a conversation. The optional fields are left out of what the template sees
    when unset, as a caller writing the dicts by hand would: templates test `message.tool_calls is
    defined`. Content beside tool calls is "", not OpenAI's null, which Qwen 3, gpt-oss, Phi and
    Granite templates cannot concatenate."""

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None  # on a "tool" message: the call whose result it carries
    reasoning: str | None = None  # an assistant's thinking before its answer

    def as_template_dict(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [call.as_template_dict() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.reasoning is not None:
            message["reasoning_content"] = self.reasoning
        return message


# A message as a `Message`, or as the dict transformers takes (OpenAI's shape).
ChatMessage = Message | Mapping[str, Any]


class TemplateError(LocalchatError):
    """A chat template that fails to parse or render."""


class TemplateRefusedError(TemplateError):
    """The template itself rejected the conversation (its `raise_exception`), e.g. roles that do not
    alternate; `rule` is the template's own message."""

    def __init__(self, template: str, rule: str) -> None:
        super().__init__(f"{template} refused this conversation: {rule}")
        self.rule = rule


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: transformers uses it to mark the assistant's text for
    training masks; rendering a prompt writes the body unchanged."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser: Parser) -> nodes.CallBlock:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        return caller()


class _Namespace(Namespace):
    """`namespace()` that refuses underscore names, so `ns.__class__`-style tricks cannot be stored."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # Jinja's signature trick: `namespace(self=...)` works
        self, attrs = args[0], dict(*args[1:], **kwargs)
        for name in attrs:
            _Namespace._check(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a template namespace cannot store the underscore name {name!r}")


class _DictBuilder:
    """`dict(...)` in a template, without handing it the `dict` type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | str | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes HTML characters and takes no separators; templates expect json.dumps.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


# The variables templates switch their thinking with, and each one's values for on and off. `enable_thinking` (Qwen 3,
# SmolLM3, GLM...) is the one localchat and its clients set; a template that reads another gets it too, in its values.
THINKING_SWITCHES: dict[str, tuple[object, object]] = {
    "enable_thinking": (True, False),
    "thinking": (True, False),  # Kimi K3, Granite 3.3, DeepSeek V3.1 as DeepSeek ships it
    "thinking_mode": ("enabled", "disabled"),  # MiniMax-M3
}
THINKING_SWITCH = "enable_thinking"


def _environment(template: str) -> ImmutableSandboxedEnvironment:
    """The sandbox transformers renders chat templates in; `template` names this one in refusals."""

    def raise_exception(rule: str) -> NoReturn:
        raise TemplateRefusedError(template, rule)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=_strftime_now, dict=_DictBuilder(),
                       namespace=_Namespace)
    return env


def _plain(value: Any) -> Any:
    """`value` rebuilt from plain JSON types, so a template never reaches a rich object's methods
    (transformers does the same); anything else becomes an inert "<TypeName>"."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):  # subclasses (enums) carry extra methods: back to the base type
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain(item) for item in value)
    if isinstance(value, np.generic):  # np.bool_(False) would otherwise become a truthy placeholder
        return _plain(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: _plain(getattr(value, field.name)) for field in dataclasses.fields(value)}
    return f"<{type(value).__name__}>"


def _template_message(message: ChatMessage) -> dict[str, Any]:
    plain = _plain(message.as_template_dict() if isinstance(message, Message) else message)
    if not isinstance(plain, dict):
        raise TemplateError(f"a chat message must be a Message or a dict, not {type(message).__name__}")
    reasoning = next((plain[key] for key in REASONING_FIELDS if plain.get(key) is not None), None)
    if reasoning is not None:
        plain = {"thinking": reasoning, **plain, "reasoning_content": reasoning}
    return plain


def fallback_template(architecture: str) -> str:
    name = FALLBACK_TEMPLATES.get(architecture, DEFAULT_FALLBACK)
    return files("localchat.assets").joinpath("templates", name).read_text(encoding="utf-8")


class ChatTemplate:
    """A compiled chat template with the model's BOS/EOS text."""

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "", origin: str = "model") -> None:
        self.source = source
        self.origin = origin
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._name = "the model's chat template" if origin == "model" else f"the {origin} chat template"
        try:
            self._template = _environment(self._name).from_string(source)
        except jinja2.TemplateSyntaxError as error:
            raise TemplateError(f"{self._name} does not parse: {error}") from error

    @functools.cached_property
    def thinking_switches(self) -> frozenset[str]:
        """The variables of THINKING_SWITCHES the template reads."""
        read = jinja2.meta.find_undeclared_variables(self._template.environment.parse(self.source))
        return frozenset(THINKING_SWITCHES).intersection(read)

    def thinking_variables(self, thinking: bool) -> dict[str, object]:
        """Each thinking switch the template reads, set for thinking on or off."""
        return {name: THINKING_SWITCHES[name][0 if thinking else 1] for name in self.thinking_switches}

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

    def render(
        self,
        messages: Sequence[ChatMessage],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> str:
        """The prompt text, as `tokenizer.apply_chat_template(messages, tokenize=False, ...)` writes it.

        `tools` are OpenAI-style function schemas; `template_kwargs` reach the template as variables
        (`enable_thinking=False`) and override bos_token/eos_token, as in transformers.
        """
        if isinstance(template_kwargs.get(THINKING_SWITCH), bool):
            template_kwargs = {**self.thinking_variables(template_kwargs[THINKING_SWITCH]), **template_kwargs}
        variables = _plain({"bos_token": self.bos_token, "eos_token": self.eos_token, **template_kwargs})
        try:
            return self._template.render(
                messages=[_template_message(message) for message in messages],
                tools=_plain(None if tools is None else list(tools)),
                documents=_plain(None if documents is None else list(documents)),
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
        except TemplateError:
            raise
        except jinja2.exceptions.SecurityError as error:
            raise TemplateError(f"{self._name} tried something unsafe: {error}") from error
        except (jinja2.TemplateError, TypeError, ValueError, LookupError, AttributeError, ArithmeticError) as error:
            raise TemplateError(f"{self._name} failed to render: {error}") from error


# The messages a context for one reply is sized around (planner.OneReply): a system prompt and a user message, or a
# user message alone (where a template may write a system prompt of its own), each of one byte of text.
_ONE_REPLY_PROBES = ((Message("system", "s"), Message("user", "u")), (Message("user", "u"),))
# BOS and EOS text in the probes: one token each, as a template's other special tokens (no fewer bytes).
_PROBE_BOS, _PROBE_EOS = "<s>", "</s>"


def chat_overhead_bytes(template: str | None, architecture: str) -> int:
    """The most UTF-8 bytes the model's template (`template`, else the fallback for `architecture`) writes around
    one reply's messages, beside their text, generation prompt included: of the probes it renders (one that takes
    no system prompt refuses the first, as it would refuse such a reply). One that renders neither counts its own
    text for each of two messages."""
    sizes = []
    with contextlib.suppress(TemplateError):
        chat = ChatTemplate.for_model(template, architecture, bos_token=_PROBE_BOS, eos_token=_PROBE_EOS)
        for messages in _ONE_REPLY_PROBES:
            with contextlib.suppress(TemplateError):
                sizes.append(len(chat.render(messages).encode()) - sum(len(message.content) for message in messages))
    return max(sizes, default=2 * len((template or fallback_template(architecture)).encode()))
