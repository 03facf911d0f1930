"""A conversation that outgrows the context: the app marks where the model's view now starts and
says how many messages were left out (real app, real default model, a 256-token context)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pilot_steps import SHORT, send, wait_until

from localchat.history import ConversationStore
from localchat.planner import PlanRequest
from localchat.settings import Settings
from localchat.tui.app import ChatApp
from localchat.tui.widgets.messages import AssistantMessage, ContextStart, UserMessage
from localchat.tui.widgets.status import StatusBar

pytestmark = pytest.mark.anyio
N_CTX = 256
RIVERS = ["Seine", "Rhine", "Danube", "Loire", "Elbe"]


def long_conversation(store: ConversationStore) -> int:
    """Five turns of about 50 tokens each: more than a 256-token context holds."""
    conversation = store.create("Rivers")
    for river in RIVERS:
        store.add_message(conversation.id, "user", f"Tell me about the {river}, the towns along its banks and where it flows into the sea.")
        store.add_message(conversation.id, "assistant", f"The {river} is a long European river; many old towns and bridges line its banks on the way to the sea.")
    return conversation.id


async def test_left_out_messages_are_marked_and_counted(settings: Settings, store: ConversationStore, default_model: Path) -> None:
    long_conversation(store)
    app = ChatApp(settings, model=str(default_model), request=PlanRequest(n_ctx=N_CTX), store=store, reply_settings=SHORT)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: not app.loading and app.engine is not None)
        await pilot.pause()
        status = app.query_one(StatusBar)
        assert app.chat is not None and status.context_size == N_CTX
        # On opening, before any reply: the next prompt already leaves the oldest turns out.
        assert status.left_out > 0 and f"({status.left_out} left out)" in status.numbers()

        await send(pilot, "Which of these rivers is the longest?")
        prompt = app.chat.prompt
        assert prompt is not None and prompt.left_out > 0 and prompt.left_out % 2 == 0  # whole turns
        assert app.last_stats is not None and app.last_stats.prompt_tokens + SHORT.max_tokens <= N_CTX  # type: ignore[operator]
        # The model's view starts at the first message the prompt holds; the ones before are not in it.
        turns = app.chat.messages
        assert turns[prompt.left_out].content in prompt.text and turns[prompt.left_out - 1].content not in prompt.text

        marker = app.query_one(ContextStart)
        text = str(marker.render())
        assert marker.left_out == prompt.left_out and f"{prompt.left_out} earlier messages left out" in text
        assert f"{N_CTX} tokens" in text
        shown = list(app.conversation_view.query("UserMessage, AssistantMessage, ContextStart"))
        assert shown.index(marker) == prompt.left_out  # right above the first message the model sees
        first_seen = shown[prompt.left_out + 1]
        assert isinstance(first_seen, UserMessage) and first_seen.text == turns[prompt.left_out].content
        assert isinstance(shown[-1], AssistantMessage) and status.left_out == prompt.left_out
        assert f"({prompt.left_out} left out)" in status.numbers()

        # A new conversation fits again: no marker, nothing left out.
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert not app.query(ContextStart) and status.left_out == 0 and "left out" not in status.numbers()
