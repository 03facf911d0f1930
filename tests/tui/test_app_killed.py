"""A killed app loses no finished message: the real app, headless in a child process, SIGKILLed
while it writes a reply."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from localchat.history import ConversationStore

CHILD = """
import sys, time
from pathlib import Path
from localchat.backends.base import SamplerSettings
from localchat.history import ConversationStore
from localchat.planner import PlanRequest
from localchat.session import GenerationSettings
from localchat.settings import Settings
from localchat.tui.app import ChatApp

marker = Path(sys.argv[2])

async def drive(pilot):
    app = pilot.app
    while app.loading or app.engine is None:
        await pilot.pause(0.05)
    app.prompt.text = "Name a colour."
    await pilot.press("enter")
    while not (app.reply is None and app.last_stats is not None):
        await pilot.pause(0.02)
    app.reply_settings = GenerationSettings(max_tokens=None, ignore_eos=True, sampler=SamplerSettings(temperature=0))
    app.prompt.text = "Now count to a thousand."
    await pilot.press("enter")
    while app.reply is None or len(app.reply.parsed.content) < 8:
        await pilot.pause(0.02)
    marker.write_text("writing")
    while True:
        await pilot.pause(0.1)

short = GenerationSettings(max_tokens=8, sampler=SamplerSettings(temperature=0))
app = ChatApp(Settings(), model=sys.argv[3], request=PlanRequest(n_ctx=1024, n_threads=1),
              store=ConversationStore(Path(sys.argv[1])), reply_settings=short)
app.run(headless=True, size=(80, 24), auto_pilot=drive)
"""


def test_a_killed_app_keeps_every_finished_message(tmp_path: Path, default_model: Path, localchat_home: Path) -> None:
    history, marker = tmp_path / "history.db", tmp_path / "writing"
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(CHILD), str(history), str(marker), str(default_model)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "LOCALCHAT_HOME": str(localchat_home)},
    )
    try:
        deadline = time.monotonic() + 90
        while not marker.exists():
            assert child.poll() is None, child.stderr.read().decode() if child.stderr else "child died"
            assert time.monotonic() < deadline, "the child never started its second reply"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    store = ConversationStore(history)
    (conversation,) = store.conversations()
    messages = store.messages(conversation.id)
    # The first turn and the second question were finished; the reply cut by the kill was not.
    assert [(m.role, m.content) for m in messages][::2] == [("user", "Name a colour."), ("user", "Now count to a thousand.")]
    assert [m.role for m in messages] == ["user", "assistant", "user"] and messages[1].content
    store.close()
