"""The editor of a conversation's system prompt."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, TextArea


class SystemPromptEditor(ModalScreen["str | None"]):
    """The system prompt of one conversation: multi-line, Ctrl+S saves."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel"), Binding("ctrl+s", "save", "Save", priority=True)]

    def __init__(self, value: str) -> None:
        super().__init__()
        self.value = value

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="system-prompt"):
            yield Label("System prompt for this conversation", classes="dialog-title")
            yield TextArea(self.value, soft_wrap=True, tab_behavior="focus")
            yield Label("Ctrl+S saves · Esc cancels · empty for none", classes="dialog-hint")

    def action_save(self) -> None:
        self.dismiss(self.query_one(TextArea).text.strip())
