"""Layout snapshots at 80x24 in the dark and light themes (pytest-textual-snapshot).

Live numbers (process memory) are pinned before the snapshot so the pictures are stable;
update them with `pytest tests/tui/test_snapshots.py --snapshot-update` after a deliberate change.
"""

from __future__ import annotations

from collections.abc import Callable

from textual.pilot import Pilot

from localchat.history import ConversationStore
from tui.app import ChatApp
from tui.widgets.status import StatusBar

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


def test_help_screen_light(snap_compare, make_app: Callable[..., ChatApp]) -> None:
    assert snap_compare(make_app(), terminal_size=SIZE, press=["f1"], run_before=pinned("textual-light"))


def test_model_picker_dark(snap_compare, make_app: Callable[..., ChatApp]) -> None:
    assert snap_compare(make_app(), terminal_size=SIZE, press=["ctrl+o"], run_before=pinned())
