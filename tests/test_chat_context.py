"""Which messages a Chat leaves out of the prompt when the conversation outgrows the context, and
that it says how many (pure logic: a stand-in backend that makes one token of each character)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from localchat.errors import ContextOverflowError
from localchat.chat import Chat
from localchat.session import GenerationSettings, Session
from localchat.templates import ChatTemplate, Message

# One line per message, so a message of n characters costs n + len("role: \n") tokens.
TEMPLATE = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"


class CharacterBackend:
    """Just what a Chat reads of a backend: a context size and a tokenizer."""

    def __init__(self, n_ctx: int) -> None:
        self.n_ctx = n_ctx
        self.first_shape_steps = 0.0

        class Info:
            add_bos = False
            eog_ids = frozenset({0})

        self.info = Info()

    def tokenize(self, text: str, *, add_bos: bool, special: bool) -> list[int]:
        return [ord(c) for c in text]

    def token_bytes(self, token: int) -> bytes:
        return chr(token).encode()

    def token_text(self, token: int) -> str:
        return chr(token)


def chat(n_ctx: int, messages: Sequence[Message]) -> Chat:
    return Chat(Session(CharacterBackend(n_ctx)), ChatTemplate(TEMPLATE), list(messages))  # type: ignore[arg-type]


TURNS = [Message("user", "u" * 20), Message("assistant", "a" * 20)] * 3 + [Message("user", "last question")]
SYSTEM = Message("system", "s" * 30)


def test_everything_fits_nothing_is_left_out() -> None:
    prompt = chat(1000, [SYSTEM, *TURNS]).fit(reply_room=10)
    assert prompt.left_out == 0 and "s" * 30 in prompt.text and len(prompt.tokens) == len(prompt.text)


def test_the_oldest_turns_go_first_and_are_counted() -> None:
    whole = len(chat(1000, [SYSTEM, *TURNS]).fit(0).tokens)
    turn = 2 * 20 + len("user: \n") + len("assistant: \n")  # one user message and its answer
    # Room for all but one turn, then for all but two.
    for dropped in (1, 2):
        prompt = chat(whole + 10 - dropped * turn, [SYSTEM, *TURNS]).fit(reply_room=10)
        assert prompt.left_out == 2 * dropped
        assert prompt.text.startswith("system: " + "s" * 30) and prompt.text.count("user: ") == 4 - dropped
        assert len(prompt.tokens) + 10 <= whole + 10 - dropped * turn


def test_the_newest_message_always_stays() -> None:
    prompt = chat(80, [SYSTEM, *TURNS]).fit(reply_room=10)
    assert prompt.left_out == len(TURNS) - 1 and prompt.text.endswith("user: last question\nassistant:")
    with pytest.raises(ContextOverflowError):
        chat(60, [SYSTEM, *TURNS]).fit(reply_room=10)


def test_a_reply_records_its_prompt() -> None:
    conversation = chat(80, [SYSTEM, *TURNS])
    assert conversation.prompt is None
    conversation.reply(GenerationSettings(max_tokens=10))
    assert conversation.prompt is not None and conversation.prompt.left_out == len(TURNS) - 1
    assert conversation.reply_room(GenerationSettings(max_tokens=None)) == 80 // 4
    assert conversation.reply_room(GenerationSettings(max_tokens=1000)) == 80 // 2
