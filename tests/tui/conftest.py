"""Fixtures for the chat app: a fresh history file per test, an app around the real engine, the
stand-in Hugging Face hub of tests/hub holding the default model for the model picker's pulls, and
a real `localchat serve` on loopback as the remote engine."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from localchat.engine import Engine
from localchat.history import ConversationStore
from localchat.settings import Settings
from pilot_steps import GEMMA_FILE, GEMMA_REPO, SHORT
from localchat.tui.app import ChatApp

sys.path.insert(0, str(Path(__file__).parent.parent / "hub"))
sys.path.insert(0, str(Path(__file__).parent.parent / "server"))
from live_server import LiveServer, start_server  # noqa: E402  (tests/server's real `localchat serve`, shared)
from stand_in_hub import HubFile, StandInHub, start_hub  # noqa: E402  (tests/hub's stand-in, shared)



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


@pytest.fixture(scope="session")
def model_hub(gemma_model: Path) -> Iterator[StandInHub]:
    """The stand-in hub on loopback with Gemma 3 270M as a one-file GGUF repo."""
    hub, stop = start_hub()
    hub.add_repo(GEMMA_REPO, [HubFile.from_disk(GEMMA_FILE, gemma_model)])
    yield hub
    stop()


@pytest.fixture
def pull_settings(model_hub: StandInHub, settings: Settings, tmp_path: Path) -> Iterator[Settings]:
    """The session's settings with this test's own Hugging Face cache, on the stand-in hub."""
    model_hub.reset()
    yield dataclasses.replace(settings, hf_cache_dir=tmp_path / "hf" / "hub", hf_endpoint=model_hub.endpoint, hf_offline=False)
    model_hub.reset()  # ends a stall a test left


@pytest.fixture(scope="session")
def remote_server(localchat_home: Path, default_model: Path) -> Iterator[LiveServer]:
    """`localchat serve` with the default model on loopback, the remote for the app's remote tests."""
    running = start_server(localchat_home)
    yield running
    running.stop()
