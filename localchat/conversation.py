"""The rules of a stored conversation, shared by every front end: what is stored when, how a
conversation is titled, what regenerating replaces, and what is undone when a turn is refused.

A front end opens a conversation on a `ChatEngine`, sends or regenerates (getting a `Turn` whose
generation it iterates and shows), and ends the turn with what it received: the `Turn` commits it
to the chat and stores it. The front end only draws.
"""

from __future__ import annotations

from dataclasses import dataclass

from localchat.chat_engine import ChatEngine, ChatGeneration, ContextUse, EngineChat
from localchat.errors import LocalchatError
from localchat.history import (
    DEFAULT_TITLE,
    Conversation,
    ConversationStore,
    StoredMessage,
    title_from,
)
from localchat.session import GenerationSettings
from localchat.templates import Message


@dataclass
class Turn:
    """A reply being written, and where it belongs once it ends."""

    store: ConversationStore
    conversation_id: int
    chat: EngineChat
    generation: ChatGeneration
    replacing: int | None = None  # the stored answer a regenerated one replaces

    def end(self, content: str, reasoning: str | None = None, finish: str | None = None) -> bool:
        """Record the reply (whole, or the part written before a stop or a failure) in the chat
        and store it with its reasoning and, for one cut short, how it ended (`finish`), unless the
        conversation was deleted meanwhile; says whether it was stored."""
        self.chat.commit(content, reasoning or None)
        if self.store.get(self.conversation_id) is None:
            return False
        self.store.add_message(self.conversation_id, "assistant", content, replacing=self.replacing, reasoning=reasoning or None,
                               finish=finish)
        return True


@dataclass(frozen=True)
class Sent:
    turn: Turn
    # A question left unanswered (the app stopped while writing its answer) got an empty
    # answer first, so that roles keep alternating, as many chat templates require.
    filled_unanswered: bool


class OpenConversation:
    """A stored conversation open on an engine (or on none yet, while a model loads)."""

    def __init__(self, store: ConversationStore, conversation: Conversation, engine: ChatEngine | None = None,
                 *, thinking: bool = True) -> None:
        self.store = store
        self.conversation = conversation
        self.chat: EngineChat | None = None
        self.attach(engine, thinking=thinking)

    @classmethod
    def open(cls, store: ConversationStore, conversation_id: int | None, engine: ChatEngine | None = None,
             *, thinking: bool = True) -> OpenConversation:
        """The stored conversation `conversation_id`, or a new one when it is None or gone."""
        conversation = store.get(conversation_id) if conversation_id is not None else None
        return cls(store, conversation or store.create(), engine, thinking=thinking)

    @property
    def id(self) -> int:
        return self.conversation.id

    @property
    def title(self) -> str:
        return self.conversation.title

    @property
    def system_prompt(self) -> str:
        return self.conversation.system_prompt

    def attach(self, engine: ChatEngine | None, *, thinking: bool = True) -> None:
        """Rebuild the chat from what is stored, on `engine` (None: no chat until one loads)."""
        if engine is None:
            self.chat = None
            return
        messages = [Message("system", self.system_prompt)] if self.system_prompt else []
        messages += [m.as_message() for m in self.store.messages(self.id)]
        self.chat = engine.open_chat(messages, thinking=thinking)

    def reload(self) -> None:
        """Read the conversation's title and system prompt again after they changed."""
        self.conversation = self.store.get(self.id) or self.conversation

    def messages(self) -> list[StoredMessage]:
        return self.store.messages(self.id)

    def is_empty(self) -> bool:
        self.reload()
        return self.title == DEFAULT_TITLE and not self.system_prompt and not self.messages()

    def next_context(self, settings: GenerationSettings) -> ContextUse | None:
        """The context the next reply's prompt fills; None when it no longer fits."""
        if self.chat is None:
            return ContextUse(0)
        try:
            return self.chat.next_context(settings)
        except LocalchatError:
            return None

    def _chat(self) -> EngineChat:
        if self.chat is None:
            raise LocalchatError("no model is loaded yet")
        return self.chat

    def send(self, text: str, settings: GenerationSettings) -> Sent:
        """Store `text` as the next question and start its reply. A question the model refuses
        (too long for the context, say) is taken back and raises: nothing is stored."""
        chat = self._chat()
        filled = bool(chat.messages) and chat.messages[-1].role == "user"
        if filled:
            chat.commit("")
        try:
            generation = chat.send(text, chat.reply_settings(settings))
        except LocalchatError:
            del chat.messages[-1 - filled :]  # send() added the message before it found it refused
            raise
        if filled:
            self.store.add_message(self.id, "assistant", "")
        self.store.add_message(self.id, "user", text)
        if self.title == DEFAULT_TITLE:
            self.store.rename(self.id, title_from(text))
            self.reload()
        return Sent(Turn(self.store, self.id, chat, generation), filled)

    def regenerate(self, settings: GenerationSettings) -> Turn | None:
        """Write the last answer again (or the answer a question lacks). The new one replaces the
        stored one when it ends; if the new reply is refused, the old answer is put back and
        this raises. None when there is no question to answer yet."""
        chat = self._chat()
        messages = chat.messages
        old = messages.pop() if messages and messages[-1].role == "assistant" else None
        if not messages or messages[-1].role != "user":
            if old is not None:
                messages.append(old)
            return None
        replacing = None
        if old is not None:
            stored = self.messages()
            replacing = stored[-1].id if stored and stored[-1].role == "assistant" else None
        try:
            generation = chat.reply(chat.reply_settings(settings))
        except LocalchatError:
            if old is not None:
                messages.append(old)
            raise
        return Turn(self.store, self.id, chat, generation, replacing)
