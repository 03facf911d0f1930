"""Fixtures for the chat app: a fresh history file per test and an app around the real engine."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from localchat.engine import Engine
from localchat.history import ConversationStore
from localchat.settings import Settings
from pilot_steps import SHORT
from tui.app import ChatApp


@pytest.fixture
def anyio_backend() -> str:
    """App tests are async (`pytest.mark.anyio`); Textual runs on asyncio."""
    return "asyncio"


@pytest.fixture
def history_path(tmp_path: Path) -> Path:
    return tmp_path / "history.db"


@pytest.fixture
def store(history_path: Path) -> Iterator[ConversationStore]:
    opened = ConversationStore(history_path)
    yield opened
    opened.close()


@pytest.fixture
def make_app(engine: Engine, settings: Settings, store: ConversationStore) -> Callable[..., ChatApp]:
    """An app on the shared engine (which the app does not close) and this test's history."""
    engine.sessions[0].reset()

    def make(**kwargs: object) -> ChatApp:
        kwargs.setdefault("engine", engine)
        kwargs.setdefault("store", store)
        kwargs.setdefault("reply_settings", SHORT)
        return ChatApp(settings, **kwargs)  # type: ignore[arg-type]

    return make
