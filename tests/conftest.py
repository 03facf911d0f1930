"""Fixtures shared by every test: an isolated localchat home and the real models localchat installs:
the default chat model (SmolLM2-135M-Instruct) and Gemma 3 270M, a base model, by name."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import pytest

from localchat.engine import Engine
from localchat.models import default_model_path, gemma_model_path
from localchat.planner import PlanRequest
from localchat.settings import Settings

# Checkpoint fixtures shared by tests/converters and tests/onnx.
pytest_plugins = ("checkpoint_fixtures",)
# A test that needs one of these (directly or through another fixture) loads the real model or
# builds and converts checkpoints: it belongs to the slow tier (`pytest -m "not slow"` skips it).
SLOW_FIXTURES = frozenset({"default_model", "gemma_model", "reference_stack"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def ctrl_c_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt, as in a terminal, even where the run was started with it
    ignored (a shell's background job: Python then keeps it ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="session", autouse=True)
def localchat_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """LOCALCHAT_HOME for the whole run, so tests never touch the user's data or caches (headers read
    anywhere are remembered under it: localchat.file_facts)."""
    home = tmp_path_factory.mktemp("localchat-home")
    os.environ["LOCALCHAT_HOME"] = str(home)
    return home


@pytest.fixture(scope="session")
def settings(localchat_home: Path) -> Settings:
    return Settings()


@pytest.fixture(scope="session")
def default_model(settings: Settings) -> Path:
    """The real default model: SmolLM2-135M-Instruct (Q4_1), a chat model, from its PyPI package."""
    return default_model_path(settings)


@pytest.fixture(scope="session")
def gemma_model(settings: Settings) -> Path:
    """The real Gemma 3 270M Q4_K_M, a base model with a 262k vocabulary, assembled from its PyPI packages."""
    return gemma_model_path(settings)


@pytest.fixture(scope="session")
def gemma_gguf_engine(settings: Settings, gemma_model: Path) -> Iterator[Engine]:
    """Gemma 3 270M in llama.cpp (2k context), for the tests that need a base model or its 262k vocabulary."""
    with Engine.load(str(gemma_model), settings, PlanRequest(n_ctx=2048)) as loaded:
        yield loaded


@pytest.fixture(scope="session")
def engine(settings: Settings, default_model: Path) -> Iterator[Engine]:
    """The real default model in llama.cpp, shared by the tests of one run (2k context)."""
    with Engine.load(str(default_model), settings, PlanRequest(n_ctx=2048)) as loaded:
        yield loaded


@pytest.fixture
def decoding_threads(monkeypatch: pytest.MonkeyPatch) -> set[int]:
    """The threads that call llama_decode from here on, recorded as they do."""
    threads: set[int] = set()
    real_decode = llama_cpp.llama_decode

    def recorded_decode(ctx: llama_cpp.llama_context_p, batch: llama_cpp.llama_batch) -> int:
        threads.add(threading.get_ident())
        return real_decode(ctx, batch)

    monkeypatch.setattr(llama_cpp, "llama_decode", recorded_decode)
    return threads
