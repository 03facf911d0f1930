"""A conversation on a session: messages rendered through the model's chat template, and the context
policy that leaves out the oldest turns when the conversation no longer fits."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

from localchat.backends.base import Backend
from localchat.chat_formats import ChatFormat, detect_format
from localchat.errors import ContextOverflowError
from localchat.reply_parser import ReplyParser
from localchat.session import Generation, GenerationSettings, Session
from localchat.templates import ChatTemplate, Message


def tokenize_chat(backend: Backend, template: ChatTemplate, messages: Sequence[Message]) -> list[int]:
    """The prompt for the assistant's next message, as the model's chat template renders it."""
    return tokenize_prompt(backend, template, template.render(messages))


def tokenize_prompt(backend: Backend, template: ChatTemplate, text: str) -> list[int]:
    """A prompt `template` rendered, as tokens (BOS added unless the template wrote it)."""
    add_bos = backend.info.add_bos and not (template.bos_token and text.startswith(template.bos_token))
    return backend.tokenize(text, add_bos=add_bos, special=True)


def continuation_text(template: ChatTemplate, text: str) -> str:
    """A prompt `template` rendered, as text that goes on after earlier tokens (an earlier exchange's
    prompt and reply): without the BOS the template writes at a prompt's start."""
    return text.removeprefix(template.bos_token) if template.bos_token else text


def tokenize_continuation(backend: Backend, template: ChatTemplate, text: str) -> list[int]:
    """continuation_text's tokens (no BOS added either)."""
    return backend.tokenize(continuation_text(template, text), add_bos=False, special=True)


@dataclass(frozen=True)
class ChatPrompt:
    """The prompt for a chat's next reply, and what of the conversation it holds."""

    text: str
    tokens: list[int]
    # The oldest user/assistant messages left out so that the prompt fits the context (the
    # system prompt never is): the model's view of the conversation starts after them.
    left_out: int


@dataclass
class Chat:
    """Messages rendered through the model's chat template onto a session.

    Context policy: when the conversation no longer fits with room for the reply, the oldest
    user/assistant messages are dropped from the prompt (the system prompt and the newest
    message always stay); the messages themselves are kept, and `prompt.left_out` says how
    many the last reply's prompt left out, for front ends to show.
    """

    session: Session
    template: ChatTemplate
    messages: list[Message] = field(default_factory=list)
    # Variables for the template beside the messages, such as `enable_thinking=False`.
    template_kwargs: dict[str, object] = field(default_factory=dict)
    prompt: ChatPrompt | None = field(default=None, init=False)  # the last reply's

    @property
    def backend(self) -> Backend:
        return self.session.backend

    @cached_property
    def format(self) -> ChatFormat:
        """The model family's reply syntax, from its template: where reasoning starts and ends."""
        return detect_format(self.template.source)

    @cached_property
    def reasoning_tokens(self) -> frozenset[int]:
        """The control tokens among the reasoning markers (gpt-oss's channels): a reply's text
        must show them (GenerationSettings.shown_tokens) for `reply_parser` to find its reasoning."""
        markers = [m for s in self.format.sections if s.kind == "reasoning" or (s.header and s.header.channels)
                   for m in (s.start, *s.end, s.header.end if s.header else "") if m]
        tokens = [t for m in markers for t in self.backend.tokenize(m, add_bos=False, special=True)]
        return frozenset(t for t in tokens if not self.backend.token_bytes(t) and self.backend.token_text(t))

    def reply_parser(self) -> ReplyParser:
        """Reads the last reply's text as it streams: its reasoning apart from its content (a
        prompt that ends inside a reasoning marker starts the reply in reasoning); tool calls
        stay text."""
        return ReplyParser(self.format, calls=False, prompt=self.prompt.text if self.prompt else "")

    def reply_room(self, settings: GenerationSettings) -> int:
        """Tokens kept free for a reply: its max_tokens, at most half the context."""
        room = settings.max_tokens if settings.max_tokens is not None else self.session.n_ctx // 4
        return min(room, self.session.n_ctx // 2)

    def fit(self, reply_room: int) -> ChatPrompt:
        """The prompt for the next reply, leaving out the oldest turns if it must."""
        system = [m for m in self.messages[:1] if m.role == "system"]
        turns = self.messages[len(system) :]
        while True:
            text = self.template.render(system + turns, **self.template_kwargs)
            tokens = tokenize_prompt(self.backend, self.template, text)
            if len(tokens) + reply_room <= self.session.n_ctx or len(turns) <= 1:
                break
            # Leave out the oldest turn: a user message and the assistant reply after it.
            turns = turns[2:] if len(turns) > 2 and turns[1].role == "assistant" else turns[1:]
        if len(tokens) >= self.session.n_ctx:
            raise ContextOverflowError(
                f"the message is {len(tokens)} tokens with the system prompt but the context holds "
                f"{self.session.n_ctx}; shorten it or raise the context size (--ctx)"
            )
        return ChatPrompt(text, tokens, len(self.messages) - len(system) - len(turns))

    def prompt_tokens(self, reply_room: int) -> list[int]:
        """The prompt for the next reply, dropping the oldest turns if it must."""
        return self.fit(reply_room).tokens

    def send(self, content: str, settings: GenerationSettings = GenerationSettings()) -> Generation:
        """Add a user message and start the reply; call `commit` with it when it is done."""
        self.messages.append(Message("user", content))
        return self.reply(settings)

    def reply(self, settings: GenerationSettings = GenerationSettings()) -> Generation:
        prompt = self.fit(self.reply_room(settings))
        generation = self.session.generate(prompt.tokens, settings)
        self.prompt = prompt
        return generation

    def commit(self, text: str, reasoning: str | None = None) -> None:
        """Record the assistant's reply (whole or, after a cancel, the part written), and the
        thinking written before it, which templates may show again."""
        self.messages.append(Message("assistant", text, reasoning=reasoning or None))
