"""One real server for the server tests: the default model, 4 slots, an API key, loopback only."""

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
