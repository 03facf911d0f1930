"""The reply worker's pacing of what it posts to the app, on a clock that does not move: the first text goes at
once, the text after it waits for the next frame (or the end), and the end is posted last."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import SimpleNamespace

import pytest
from textual.message import Message

from localchat.tui import replies
from localchat.tui.replies import ReplyEnded, ReplyText, write_reply


class ScriptedGeneration:
    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces

    def stream(self, emit: Callable[[str], None]) -> None:
        for piece in self.pieces:
            emit(piece)

    def cancel(self) -> None:
        pass


def test_the_first_text_is_posted_at_once_and_the_rest_at_the_next_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replies.time, "monotonic", lambda: 1000.0)
    monkeypatch.setattr(replies, "get_current_worker", lambda: SimpleNamespace(is_cancelled=False))
    reply = SimpleNamespace(turn=SimpleNamespace(generation=ScriptedGeneration(["The", " capital", " is"])),
                            done=threading.Event())
    posted: list[Message] = []
    write_reply(reply, posted.append)  # type: ignore[arg-type]
    assert [m.text if isinstance(m, ReplyText) else type(m).__name__ for m in posted] == ["The", " capital is", "ReplyEnded"]
    assert isinstance(posted[-1], ReplyEnded) and posted[-1].error is None and reply.done.is_set()
