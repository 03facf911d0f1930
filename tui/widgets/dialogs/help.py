"""The help dialog: every key, one per row."""

from __future__ import annotations

from collections.abc import Iterable

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

# Keys handled by the message editor itself, listed first.
EDITOR_KEYS = [("Enter", "send the message"), ("Ctrl+J / Shift+Enter", "new line in the message")]
# Keys listed last: the conversation list's own and Textual's command palette.
OTHER_KEYS = [("r / d", "in the list: rename / delete a conversation"), ("Ctrl+P", "command palette: themes, keys, quit")]


def key_label(keys: str) -> str:
    """Textual key names as a person reads them: "ctrl+q,f1" -> "Ctrl+Q / F1"."""
    names = {"escape": "Esc", "enter": "Enter", "delete": "Delete"}
    labels = []
    for key in keys.split(","):
        parts = key.split("+")
        labels.append("+".join(names.get(p, p.upper() if len(p) <= 2 else p.capitalize()) for p in parts))
    return " / ".join(labels)


def help_rows(bindings: Iterable[BindingType]) -> list[tuple[str, str]]:
    """The editor's keys, then the app's `bindings` with their tooltips, then the other keys."""
    rows = list(EDITOR_KEYS)
    for binding in bindings:
        assert isinstance(binding, Binding)
        rows.append((key_label(binding.key), binding.tooltip or binding.description))
    return rows + OTHER_KEYS


class HelpScreen(ModalScreen[None]):
    """The key bindings, one per row."""

    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close")]

    def __init__(self, rows: list[tuple[str, str]]) -> None:
        super().__init__()
        self.rows = rows

    def compose(self) -> ComposeResult:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold", no_wrap=True)
        table.add_column()
        for keys, description in self.rows:
            table.add_row(keys, description)
        with Vertical(classes="dialog", id="help") as dialog:
            dialog.border_title = "Keys"
            dialog.border_subtitle = "Esc closes"
            yield Static(table)
