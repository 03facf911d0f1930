"""The conversation rules every front end shares: titling, storing, regenerating, rolling back.

The fast tests run the rules on a scripted chat (a protocol-true `EngineChat` that replays text);
the slow ones on the real model, where the refusals come from the real context."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from localchat.backends.base import SamplerSettings
from localchat.chat_engine import (
    ChatEngine,
    ChatGeneration,
    ContextUse,
    EngineChat,
    LocalChat,
)
from localchat.chat_formats import GENERIC
from localchat.conversation import OpenConversation
from localchat.engine import Engine
from localchat.errors import LocalchatError
from localchat.history import DEFAULT_TITLE, ConversationStore, title_from
from localchat.remote import RemoteChat, RemoteGeneration, RemoteServer
from localchat.reply_parser import ReplyParser
from localchat.session import Generation, GenerationSettings, GenerationStats
from localchat.templates import Message

SHORT = GenerationSettings(max_tokens=6, sampler=SamplerSettings(temperature=0))


@dataclass
class ScriptedGeneration:
    pieces: list[str]
    stats: GenerationStats | None = None
    started_at: float = 0.0
    first_token_at: float | None = None
    tokens_per_second: float = 0.0

    def __iter__(self) -> Iterator[str]:
        return iter(self.pieces)

    def stream(self, emit: Callable[[str], None]) -> None:
        for piece in self.pieces:
            emit(piece)

    def cancel(self) -> None:
        pass


@dataclass
class ScriptedChat:
    """Replies with the next scripted text; a question containing "refuse" is refused as too long."""

    messages: list[Message]
    replies: list[str] = field(default_factory=lambda: ["one", "two", "three"])

    def send(self, content: str, settings: GenerationSettings = SHORT) -> ScriptedGeneration:
        self.messages.append(Message("user", content))
        return self.reply(settings)

    def reply(self, settings: GenerationSettings = SHORT) -> ScriptedGeneration:
        if "refuse" in self.messages[-1].content:
            raise LocalchatError("the message is too long")
        return ScriptedGeneration([self.replies.pop(0)])

    def commit(self, text: str, reasoning: str | None = None) -> None:
        self.messages.append(Message("assistant", text, reasoning=reasoning))

    def reply_parser(self) -> ReplyParser:
        return ReplyParser(GENERIC, calls=False)

    def reply_settings(self, settings: GenerationSettings) -> GenerationSettings:
        return settings

    def next_context(self, settings: GenerationSettings) -> ContextUse:
        return ContextUse(None)

    def context_used(self) -> int | None:
        return None

    def left_out(self) -> int:
        return 0


class ScriptedEngine:
    model_name = "scripted"
    backend_label = "script"
    context_size = None
    uses_gpu = False
    can_switch_thinking = False

    def __init__(self) -> None:
        self.replies = ["one", "two", "three"]

    def open_chat(self, messages: list[Message], *, thinking: bool = True) -> ScriptedChat:
        return ScriptedChat(messages, self.replies)

    def token_count(self, text: str) -> int | None:
        return None

    def close(self) -> None:
        pass


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ConversationStore]:
    opened = ConversationStore(tmp_path / "history.db")
    yield opened
    opened.close()


def reply_of(turn_text: list[str]) -> str:
    return "".join(turn_text)


def members(protocol: type) -> list[str]:
    return [name for name in [*vars(protocol), *protocol.__annotations__] if not name.startswith("_") or name == "__iter__"]


def offers(cls: type, member: str) -> bool:
    """A class attribute, a declared field, or an attribute its __init__ sets."""
    def declares(k: type) -> bool:
        init = vars(k).get("__init__")
        return member in vars(k).get("__annotations__", {}) or (init is not None and member in init.__code__.co_names)

    return hasattr(cls, member) or any(declares(k) for k in cls.__mro__)


def test_both_engines_offer_the_whole_interface() -> None:
    assert "open_chat" in members(ChatEngine) and "next_context" in members(EngineChat) and "stats" in members(ChatGeneration)
    for protocol, local, remote in ((ChatEngine, Engine, RemoteServer), (EngineChat, LocalChat, RemoteChat),
                                    (ChatGeneration, Generation, RemoteGeneration)):
        for member in members(protocol):
            assert offers(local, member) and offers(remote, member), (protocol.__name__, member)


def test_a_sent_message_titles_the_conversation_and_its_reply_is_stored(store: ConversationStore) -> None:
    conversation = OpenConversation.open(store, None, ScriptedEngine())
    sent = conversation.send("What colour is the sky on a clear day, usually?", SHORT)
    assert not sent.filled_unanswered
    assert conversation.conversation.title == title_from("What colour is the sky on a clear day, usually?")
    text = reply_of(list(sent.turn.generation))
    assert sent.turn.end(text, "thought about it")
    stored = store.messages(conversation.id)
    assert [(m.role, m.content, m.reasoning) for m in stored] == [
        ("user", "What colour is the sky on a clear day, usually?", None), ("assistant", "one", "thought about it")]
    # A second message keeps the first title.
    conversation.send("And at night?", SHORT).turn.end("two")
    assert store.get(conversation.id).title == title_from("What colour is the sky on a clear day, usually?")  # type: ignore[union-attr]


def test_an_unanswered_question_gets_an_empty_answer_so_roles_alternate(store: ConversationStore) -> None:
    first = store.create()
    store.add_message(first.id, "user", "left without an answer")  # the app was killed while answering
    conversation = OpenConversation.open(store, first.id, ScriptedEngine())
    sent = conversation.send("Hello again", SHORT)
    assert sent.filled_unanswered
    assert [(m.role, m.content) for m in store.messages(first.id)] == [
        ("user", "left without an answer"), ("assistant", ""), ("user", "Hello again")]
    assert conversation.chat is not None and [m.role for m in conversation.chat.messages] == ["user", "assistant", "user"]


def test_a_refused_message_is_taken_back_and_nothing_is_stored(store: ConversationStore) -> None:
    first = store.create()
    store.add_message(first.id, "user", "left without an answer")
    conversation = OpenConversation.open(store, first.id, ScriptedEngine())
    with pytest.raises(LocalchatError, match="too long"):
        conversation.send("please refuse this", SHORT)
    assert [m.content for m in store.messages(first.id)] == ["left without an answer"]
    assert conversation.chat is not None and [m.content for m in conversation.chat.messages] == ["left without an answer"]
    assert store.get(first.id).title == DEFAULT_TITLE  # type: ignore[union-attr]


def test_regenerate_replaces_the_stored_answer(store: ConversationStore) -> None:
    conversation = OpenConversation.open(store, None, ScriptedEngine())
    conversation.send("Hi", SHORT).turn.end("one")
    turn = conversation.regenerate(SHORT)
    assert turn is not None and turn.replacing == store.messages(conversation.id)[-1].id
    assert conversation.chat is not None and conversation.chat.messages[-1].role == "user"  # the old answer is out of the prompt
    turn.end(reply_of(list(turn.generation)))
    assert [(m.role, m.content) for m in store.messages(conversation.id)] == [("user", "Hi"), ("assistant", "two")]


def test_a_refused_regenerate_puts_the_old_answer_back(store: ConversationStore) -> None:
    conversation = OpenConversation.open(store, None, ScriptedEngine())
    chat = conversation.chat
    assert isinstance(chat, ScriptedChat)
    conversation.send("Hi", SHORT).turn.end("one")
    chat.messages[-2] = Message("user", "now refuse")  # as if the context had shrunk meanwhile
    with pytest.raises(LocalchatError):
        conversation.regenerate(SHORT)
    assert [m.content for m in chat.messages] == ["now refuse", "one"]


def test_nothing_to_regenerate(store: ConversationStore) -> None:
    conversation = OpenConversation.open(store, None, ScriptedEngine())
    assert conversation.regenerate(SHORT) is None
    assert conversation.is_empty()


def test_a_reply_ending_after_its_conversation_was_deleted_is_not_stored(store: ConversationStore) -> None:
    conversation = OpenConversation.open(store, None, ScriptedEngine())
    turn = conversation.send("Hi", SHORT).turn
    store.delete(conversation.id)
    assert not turn.end("one")
    assert store.get(conversation.id) is None


def test_without_an_engine_nothing_is_sent(store: ConversationStore) -> None:
    conversation = OpenConversation.open(store, None, None)
    with pytest.raises(LocalchatError, match="no model"):
        conversation.send("Hi", SHORT)
    assert conversation.next_context(SHORT) == ContextUse(0) and not store.messages(conversation.id)


# The real model: the local engine behind the interface, and its real refusals.


def test_a_local_turn_on_the_real_model(engine: Engine, store: ConversationStore) -> None:
    engine.sessions[0].reset()
    conversation = OpenConversation.open(store, None, engine)
    sent = conversation.send("Name a colour.", SHORT)
    text = "".join(sent.turn.generation)
    assert sent.turn.generation.stats is not None and sent.turn.generation.stats.completion_tokens > 0
    assert sent.turn.chat.context_used() == len(engine.sessions[0].tokens) > 0
    sent.turn.end(text)
    assert [m.content for m in store.messages(conversation.id)] == ["Name a colour.", text]
    use = conversation.next_context(SHORT)
    assert use is not None and use.tokens is not None and use.tokens > 5 and use.left_out == 0


def test_a_question_longer_than_the_context_is_refused_on_the_real_model(engine: Engine, store: ConversationStore) -> None:
    conversation = OpenConversation.open(store, None, engine)
    with pytest.raises(LocalchatError, match="context"):
        conversation.send("word " * (engine.context_size + 10), SHORT)
    assert not store.messages(conversation.id) and conversation.chat is not None and not conversation.chat.messages
