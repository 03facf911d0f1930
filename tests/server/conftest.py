"""One real server for the server tests: the default model, 4 slots, an API key, loopback only; and
one for each module that loads Gemma beside it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
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
