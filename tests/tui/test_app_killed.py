"""A killed app loses no finished message: the real app in a child process (headless, or in a
pseudo-terminal), killed while it writes a reply."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

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
    marker.write_text(app.reply.parsed.content)  # the pilot ends here, the app runs on

short = GenerationSettings(max_tokens=8, sampler=SamplerSettings(temperature=0))
app = ChatApp(Settings(), model=sys.argv[3], request=PlanRequest(n_ctx=1024, n_threads=1),
              store=ConversationStore(Path(sys.argv[1])), reply_settings=short)
sys.exit(app.run(headless=not sys.stdout.isatty(), size=(80, 24), auto_pilot=drive))
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


def _read(terminal: int) -> bytes:
    """What the app drew in 50 ms (read, so that the app never waits to draw); nothing once the test
    closed its side (-1) or the app closed its own (EIO)."""
    if terminal >= 0 and select.select([terminal], [], [], 0.05)[0]:
        try:
            return os.read(terminal, 1 << 16)
        except OSError:
            pass
    time.sleep(0.05)
    return b""


def _written_so_far(history: Path, marker: Path) -> None:
    """The history holds the first turn, the second question and the start of its reply, cut where
    the app was stopped: at least what it had written when the marker was left."""
    store = ConversationStore(history)
    (conversation,) = store.conversations()
    messages = store.messages(conversation.id)
    store.close()
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[2].content == "Now count to a thousand."
    assert messages[3].content.startswith(marker.read_text().rstrip())


@pytest.mark.parametrize(("how", "status"), [("SIGTERM", 143), ("SIGHUP", 129), ("terminal closed", 129)])
def test_a_terminated_app_keeps_the_reply_it_was_writing(tmp_path: Path, default_model: Path, localchat_home: Path,
                                                          how: str, status: int) -> None:
    """`kill` (SIGTERM), a hangup (SIGHUP), or the terminal window closed (the pseudo-terminal's side
    the test holds, which the kernel follows with SIGHUP) while a reply is written: the reply is
    stored as Ctrl+Q stores it, and the status is a killed process's, 128 + the signal's number."""
    history, marker = tmp_path / "history.db", tmp_path / "writing"
    pid, terminal = pty.fork()
    if pid == 0:  # the child: the app in a terminal
        os.environ.update(TERM="xterm-256color", LOCALCHAT_HOME=str(localchat_home))
        os.execv(sys.executable, [sys.executable, "-c", textwrap.dedent(CHILD), str(history), str(marker), str(default_model)])
    screen, stopped, exit_status, deadline = b"", False, None, time.monotonic() + 120
    try:
        while exit_status is None:
            assert time.monotonic() < deadline, f"the child never ended: {screen[-2000:]!r}"
            screen += _read(terminal)
            if not stopped and marker.exists():
                stopped = True
                if how == "terminal closed":
                    os.close(terminal)
                    terminal = -1
                else:
                    os.kill(pid, getattr(signal, how))
            done, wait_status = os.waitpid(pid, os.WNOHANG)
            if done:
                exit_status = os.waitstatus_to_exitcode(wait_status)
    finally:
        if exit_status is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        if terminal >= 0:
            os.close(terminal)
    assert stopped, screen[-2000:]
    assert exit_status == status, screen[-2000:]
    _written_so_far(history, marker)
