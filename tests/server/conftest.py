"""One real server for the server tests: the default model, 4 slots, an API key, loopback only; one for each
module that loads Gemma beside it; and one of a copy of the default model with fill-in-the-middle tokens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fim_model import write_fim_copy
from live_server import LiveServer, start_server


@pytest.fixture(scope="session")
def server(localchat_home: Path, default_model: Path) -> Iterator[LiveServer]:
    running = start_server(localchat_home)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def gemma_server(localchat_home: Path) -> Iterator[LiveServer]:
    """A server of the module's own, for requests that load Gemma beside the default model: the shared
    server's other tests expect one model loaded and its slots idle."""
    running = start_server(localchat_home)
    yield running
    running.stop()


@pytest.fixture(scope="session")
def fim_model(default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default model's copy whose metadata names FIM tokens (fim_model.py)."""
    return write_fim_copy(default_model, tmp_path_factory.mktemp("fim-model") / "smollm2-fim.gguf")


@pytest.fixture(scope="session")
def fim_server(localchat_home: Path, fim_model: Path) -> Iterator[LiveServer]:
    running = start_server(localchat_home, "-m", str(fim_model))
    yield running
    running.stop()
