"""A reply's thinking, folded above its answer: real app, real default model, real chat templates
with thinking markers (tests/data/chat_templates) in place of the model's own."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pilot_steps import press_and_wait_for_reply, send, wait_until
from textual.widgets._collapsible import CollapsibleTitle

from localchat.engine import Engine
from localchat.history import ConversationStore
from localchat.templates import ChatTemplate
from localchat.tui.app import ChatApp, ReplyText
from localchat.tui.widgets.messages import AssistantMessage, Reasoning

pytestmark = pytest.mark.anyio
MakeApp = Callable[..., ChatApp]
TEMPLATES = Path(__file__).parent.parent / "data" / "chat_templates"


@pytest.fixture
def with_template(engine: Engine) -> Iterator[Callable[[str], None]]:
    """Puts a real model's template on the shared engine for one test."""
    own = engine.template

    def use(name: str) -> None:
        source = (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")
        engine.template = ChatTemplate(source, bos_token=own.bos_token, eos_token=own.eos_token)

    yield use
    engine.template = own


async def open_thinking(pilot, thinking: Reasoning) -> None:  # type: ignore[no-untyped-def]
    thinking.query_one(CollapsibleTitle).focus()
    await pilot.press("enter")
    await pilot.pause()


async def test_a_prompt_that_opens_thinking_folds_the_reply_into_it(make_app: MakeApp, store: ConversationStore,
                                                                    with_template: Callable[[str], None]) -> None:
    """DeepSeek R1's prompt ends with `<think>`: what the model writes is its thinking."""
    with_template("deepseek_r1_distill")
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await send(pilot, "What is two plus two?")
        assert app.chat is not None and app.chat.prompt is not None and app.chat.prompt.text.endswith("<think>\n")
        stored = store.messages(app.conversation.id)[-1]  # type: ignore[union-attr]
        assert stored.reasoning and app.chat.messages[-1].reasoning == stored.reasoning
        thinking = app.query_one(Reasoning)
        tokens = len(app.engine.backend.tokenize(stored.reasoning, add_bos=False, special=False))  # type: ignore[union-attr]
        assert thinking.collapsed and thinking.text == stored.reasoning and thinking.title == f"Thought for {tokens} tokens"
        assert app.query(AssistantMessage).last().text == stored.content  # only what follows the thinking
        await open_thinking(pilot, thinking)
        assert not thinking.collapsed and thinking.query_one("Contents").display
        await press_and_wait_for_reply(pilot, "ctrl+r")  # the new answer replaces the old one, thinking and all
        assert len(app.query(Reasoning)) == len(app.query(AssistantMessage)) == 1
        assert app.query_one(Reasoning).text == store.messages(app.conversation.id)[-1].reasoning  # type: ignore[union-attr]


async def test_thinking_split_across_pieces_is_folded_stored_and_shown_again(
        make_app: MakeApp, store: ConversationStore, engine: Engine, with_template: Callable[[str], None]) -> None:
    """Text with Qwen 3's markers, in pieces that cut them, through the app's reply path: the
    reply's worker is held back, so the text is the one given here."""
    with_template("qwen3")
    app = make_app()
    engine.sessions[0].lock.acquire()
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            app.prompt.text = "Hello!"
            await pilot.press("enter")
            await wait_until(pilot, lambda: app.reply is not None)
            for piece in ["<thi", "nk>\nThe user greets me.", " I greet back.\n</th", "ink>\n\nHello! How can", " I help?"]:
                app.post_message(ReplyText(piece))
            answer = app.query(AssistantMessage).last()
            await wait_until(pilot, lambda: answer.text == "Hello! How can I help?")
            thinking = app.query_one(Reasoning)
            assert thinking.text == "The user greets me. I greet back." and thinking.title == "Thinking…" and thinking.collapsed
            await pilot.press("escape")
            engine.sessions[0].lock.release()
            await wait_until(pilot, lambda: app.reply is None)
            stored = store.messages(app.conversation.id)[-1]  # type: ignore[union-attr]
            assert (stored.content, stored.reasoning) == ("Hello! How can I help?", "The user greets me. I greet back.")
            assert thinking.title.startswith("Thought for ")
    finally:
        if engine.sessions[0].lock.locked():
            engine.sessions[0].lock.release()

    again = make_app()
    async with again.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        thinking = again.query_one(Reasoning)
        assert thinking.collapsed and thinking.text == "The user greets me. I greet back."
        assert again.chat is not None and again.chat.messages[-1].reasoning == thinking.text
        await open_thinking(pilot, thinking)
        assert not thinking.collapsed


async def test_the_thinking_switch_reaches_the_template_and_is_kept(make_app: MakeApp, store: ConversationStore,
                                                                    with_template: Callable[[str], None]) -> None:
    with_template("qwen3")
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("f3")
        assert not app.thinking and store.preference("thinking") == "off"
        await send(pilot, "Name a colour.")
        assert app.chat is not None and app.chat.prompt is not None
        assert app.chat.prompt.text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # Qwen 3's "no thinking"
        assert not app.query(Reasoning)
    again = make_app()
    async with again.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert not again.thinking and again.chat is not None and again.chat.template_kwargs == {"enable_thinking": False}
        await pilot.press("f3")
        assert again.thinking and again.chat.template_kwargs == {"enable_thinking": True}
        await send(pilot, "And another?")
        assert again.chat.prompt is not None and again.chat.prompt.text.endswith("<|im_start|>assistant\n")


async def test_thinking_on_reaches_a_template_that_thinks_only_when_asked(make_app: MakeApp, with_template: Callable[[str], None]) -> None:
    """Granite 3.3 thinks only when its own `thinking` switch is on: the app's switch, on by default, turns it on."""
    with_template("granite3_3")
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        assert app.thinking
        await send(pilot, "Name a colour.")
        assert app.chat is not None and app.chat.prompt is not None
        assert "Write your thoughts between <think></think>" in app.chat.prompt.text
