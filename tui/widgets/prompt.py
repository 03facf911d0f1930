"""The message editor: multi-line, Enter sends, Ctrl+J (or Shift+Enter where the terminal tells) adds a line."""

from __future__ import annotations

from dataclasses import dataclass

from textual import events
from textual.message import Message

from localchat.tui.widgets.paragraph_area import ParagraphArea

NEWLINE_KEYS = ("ctrl+j", "shift+enter", "alt+enter")


class PromptInput(ParagraphArea):
    @dataclass
    class Submitted(Message):
        text: str

    def __init__(self, **kwargs: object) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus", **kwargs)  # type: ignore[arg-type]

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.post_message(self.Submitted(self.text))
        elif event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.insert("\n")
        else:
            await super()._on_key(event)
