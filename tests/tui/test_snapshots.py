"""Layout snapshots at 80x24 in the dark and light themes (pytest-textual-snapshot).

Live numbers (process memory, a reply's speed) are pinned before the snapshot so the pictures are stable;
update them with `pytest tests/tui/test_snapshots.py --snapshot-update` after a deliberate change.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path

from pilot_steps import wait_until
from textual.pilot import Pilot

from localchat.engine import Engine
from localchat.history import ConversationStore
from localchat.tui.app import ChatApp, ReplyStats, ReplyText
from localchat.tui.widgets.messages import AssistantMessage
from localchat.tui.widgets.status import StatusBar

SIZE = (80, 24)
ANSWER = """Here is a function that adds two numbers:

```python
def add(a: int, b: int) -> int:
    return a + b
```

Call it as `add(2, 3)`; it returns **5**."""


def pinned(theme: str = "textual-dark") -> Callable[[Pilot], object]:
    async def run_before(pilot: Pilot) -> None:
        app = pilot.app
        assert isinstance(app, ChatApp)
        app.memory_timer.pause()
        app.query_one(StatusBar).rss_bytes = 400 * 1024**2
        app.query_one(StatusBar).gpu_bytes = None  # the same picture with or without a GPU
        app.prompt.cursor_blink = False
        app.theme = theme
        await pilot.pause()

    return run_before


def with_conversation(store: ConversationStore) -> None:
    conversation = store.create("Adding numbers in Python")
    store.add_message(conversation.id, "user", "Write a Python function that adds two numbers.")
    store.add_message(conversation.id, "assistant", ANSWER)


def test_empty_chat_dark(snap_compare, make_app: Callable[..., ChatApp]) -> None:
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=pinned())


def test_conversation_dark(snap_compare, make_app: Callable[..., ChatApp], store: ConversationStore) -> None:
    with_conversation(store)
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=pinned())


def test_conversation_light(snap_compare, make_app: Callable[..., ChatApp], store: ConversationStore) -> None:
    with_conversation(store)
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=pinned("textual-light"))


def test_folded_thinking_dark(snap_compare, make_app: Callable[..., ChatApp], store: ConversationStore) -> None:
    conversation = store.create("Adding numbers in Python")
    store.add_message(conversation.id, "user", "Write a Python function that adds two numbers.")
    store.add_message(conversation.id, "assistant", ANSWER, reasoning="The user wants a function.\nTwo arguments, typed.")
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=pinned())


def test_help_screen_light(snap_compare, make_app: Callable[..., ChatApp]) -> None:
    assert snap_compare(make_app(), terminal_size=SIZE, press=["f1"], run_before=pinned("textual-light"))


def test_model_picker_dark(snap_compare, make_app: Callable[..., ChatApp], tmp_path: Path) -> None:
    app = make_app()
    app.settings = dataclasses.replace(app.settings, hf_cache_dir=tmp_path / "hf")  # not this machine's models
    assert snap_compare(app, terminal_size=SIZE, press=["ctrl+o"], run_before=pinned())


HAIKU = "Waves fold into foam\nsalt wind carries the gulls home\nthe tide keeps its time"


async def writing(pilot: Pilot) -> None:
    """A reply being written, with the widest figures of a 2k context: its worker is held back
    (see below), so the text and numbers are ones the app is given."""
    app = pilot.app
    assert isinstance(app, ChatApp)
    await pinned()(pilot)
    app.query_one(StatusBar).rss_bytes = int(1.2 * 1024**3)
    app.prompt.text = "Write a haiku about the sea."
    await pilot.press("enter")
    await wait_until(pilot, lambda: app.reply is not None)
    app.post_message(ReplyText(HAIKU))
    app.post_message(ReplyStats(tokens_per_s=123.4, ttft_s=0.25, context_used=1536))
    reply = app.query(AssistantMessage).last()
    await wait_until(pilot, lambda: reply.source == HAIKU and app.query_one(StatusBar).context_used == 1536)


def test_reply_being_written_dark(snap_compare, make_app: Callable[..., ChatApp], engine: Engine) -> None:
    """While a reply streams at 80 columns, speed, context and memory stay whole (issue 14)."""
    app = make_app()
    lock, done = engine.sessions[0].lock, threading.Event()

    def release_on_exit() -> None:
        while app.return_value is None and not done.is_set():  # the screenshot is the return value
            time.sleep(0.01)
        lock.release()

    lock.acquire()  # the reply's worker waits for the session until the screenshot is taken
    releaser = threading.Thread(target=release_on_exit)
    releaser.start()
    try:
        assert snap_compare(app, terminal_size=SIZE, run_before=writing)
    finally:
        done.set()
        releaser.join()
