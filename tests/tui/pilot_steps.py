"""Steps the app tests share: reply settings and waiting on a running app."""

from __future__ import annotations

import time
from collections.abc import Callable

from textual.pilot import Pilot

from localchat.backends.base import SamplerSettings
from localchat.session import GenerationSettings
from localchat.tui.app import ChatApp

# Short greedy replies keep a real turn on the real model well under a second on an idle machine.
SHORT = GenerationSettings(max_tokens=8, sampler=SamplerSettings(temperature=0))
# The default model as the stand-in hub's one-file GGUF repo, for the model picker's pulls.
GEMMA_REPO = "stand-in/gemma-3-270m-GGUF"
GEMMA_FILE = "gemma-3-270m-Q4_K_M.gguf"
# A reply that runs until it is stopped.
ENDLESS = GenerationSettings(max_tokens=None, ignore_eos=True, sampler=SamplerSettings(temperature=0))


async def wait_until(pilot: Pilot, predicate: Callable[[], object], timeout: float = 120.0) -> None:
    """Let the app run until `predicate()` is true."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {predicate}")
        await pilot.pause(0.02)
    await pilot.pause()


async def send(pilot: Pilot, text: str) -> None:
    """Type a message, press Enter and wait until the reply is stored."""
    app = pilot.app
    assert isinstance(app, ChatApp)
    app.prompt.focus()
    app.prompt.text = text
    await press_and_wait_for_reply(pilot, "enter")


async def press_and_wait_for_reply(pilot: Pilot, key: str) -> None:
    """Press a key that starts a reply and wait until the reply has ended and been stored."""
    app = pilot.app
    assert isinstance(app, ChatApp)
    app.last_stats = None
    await pilot.press(key)
    await wait_until(pilot, lambda: app.reply is None and app.last_stats is not None)
