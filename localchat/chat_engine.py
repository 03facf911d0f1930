"""What a chat front end needs of a model, local or remote: the one small interface the TUI talks to.

A local `Engine` (its chats are `session.Chat`s over token-level backends) and a remote server
(`localchat.remote`, messages over HTTP) both implement it; the front end never knows which it
has. Token-level concerns stay in the backends: this interface speaks messages and text.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from localchat.chat import Chat
from localchat.reply_parser import ReplyParser
from localchat.session import GenerationSettings, GenerationStats
from localchat.templates import Message

if TYPE_CHECKING:
    from localchat.presets import ModelPreset


@dataclass(frozen=True)
class ContextUse:
    """How much of the context the next reply's prompt fills (None when the engine cannot count
    tokens before it sends), and the oldest messages it leaves out to fit."""

    tokens: int | None
    left_out: int = 0


class ChatGeneration(Protocol):
    """A reply being written: iterate for text pieces; `cancel()` from any thread stops it;
    `stats` is set once it ends."""

    stats: GenerationStats | None

    @property
    def started_at(self) -> float: ...

    @property
    def first_token_at(self) -> float | None: ...

    @property
    def tokens_per_second(self) -> float: ...

    def __iter__(self) -> Iterator[str]: ...

    def stream(self, emit: Callable[[str], None]) -> None:
        """Run to the end, passing each text piece to `emit`, on the thread the engine computes on where
        it has one (see Generation.stream); `emit` must not wait for the caller's thread."""
        ...

    def cancel(self) -> None: ...


class EngineChat(Protocol):
    """One conversation on an engine: its messages, a reply to start, the reply to record."""

    messages: list[Message]

    def send(self, content: str, settings: GenerationSettings = ...) -> ChatGeneration: ...

    def reply(self, settings: GenerationSettings = ...) -> ChatGeneration: ...

    def commit(self, text: str, reasoning: str | None = None) -> None: ...

    def reply_parser(self) -> ReplyParser:
        """Splits the last reply's text, as it streams, into reasoning and content."""
        ...

    def reply_settings(self, settings: GenerationSettings) -> GenerationSettings:
        """`settings` with what this chat needs to tell the reply's reasoning apart."""
        ...

    def next_context(self, settings: GenerationSettings) -> ContextUse:
        """The context the next reply's prompt fills; raises LocalchatError when it cannot fit."""
        ...

    def context_used(self) -> int | None:
        """Tokens the context holds now (growing while a reply is written); None when unknown."""
        ...

    def left_out(self) -> int:
        """Messages the last reply's prompt left out to fit the context."""
        ...


class ChatEngine(Protocol):
    """A model to chat with, and what a status bar says about it."""

    @property
    def model_name(self) -> str: ...

    @property
    def backend_label(self) -> str: ...

    @property
    def context_size(self) -> int | None: ...

    @property
    def uses_gpu(self) -> bool: ...

    @property
    def can_switch_thinking(self) -> bool:
        """Whether `open_chat(thinking=False)` turns the model's thinking off (or asks to)."""
        ...

    @property
    def thinking_switch_checked(self) -> bool:
        """Whether the engine saw its template read the switch (a local model's), rather than
        asking a server whose template may ignore it."""
        ...

    def open_chat(self, messages: list[Message], *, thinking: bool = True) -> EngineChat: ...

    def token_count(self, text: str) -> int | None:
        """Tokens `text` is for the model, None when the engine cannot count them."""
        ...

    def close(self) -> None: ...


@dataclass
class LocalChat(Chat):
    """A `session.Chat` as an `EngineChat`: context counts from its session's tokens. `preset`: the one its model
    runs as, whose stop strings and reply limit take the place of the front end's."""

    preset: ModelPreset | None = None

    def reply_settings(self, settings: GenerationSettings) -> GenerationSettings:
        if self.preset is not None:
            settings = self.preset.reply_settings(settings)
        # Reasoning markers that are control tokens must show in the text for the parser to see them.
        shown = settings.shown_tokens | self.reasoning_tokens
        return dataclasses.replace(settings, shown_tokens=shown)

    def next_context(self, settings: GenerationSettings) -> ContextUse:
        if not self.messages:
            return ContextUse(0)
        prompt = self.fit(self.reply_room(self.reply_settings(settings)))
        return ContextUse(len(prompt.tokens), prompt.left_out)

    def context_used(self) -> int | None:
        return len(self.session.tokens)

    def left_out(self) -> int:
        return self.prompt.left_out if self.prompt is not None else 0


