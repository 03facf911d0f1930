"""Modal screens: help, model picker, rename, delete confirmation, system prompt."""

from __future__ import annotations

from dataclasses import dataclass

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, OptionList, Static, TextArea
from textual.widgets.option_list import Option


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


@dataclass(frozen=True)
class ModelChoice:
    label: str
    model: str | None  # what Engine.load takes: None for the default model, else a path
    detail: str


class ModelPicker(ModalScreen["ModelChoice | None"]):
    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(self, choices: list[ModelChoice], current: str | None) -> None:
        super().__init__()
        self.choices = choices
        self.current = current

    def compose(self) -> ComposeResult:
        options = [Option(f"{c.label}  [dim]{c.detail}[/]", id=str(i)) for i, c in enumerate(self.choices)]
        with Vertical(classes="dialog", id="model-picker"):
            yield Label("Choose a model", classes="dialog-title")
            yield OptionList(*options)
            yield Label("Enter loads it · Esc cancels", classes="dialog-hint")

    def on_mount(self) -> None:
        options = self.query_one(OptionList)
        labels = [c.label for c in self.choices]
        if self.current in labels:
            options.highlighted = labels.index(self.current)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(self.choices[int(event.option.id or 0)])


class TextPrompt(ModalScreen["str | None"]):
    """One line of text, such as a conversation's new title."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(self, title: str, value: str) -> None:
        super().__init__()
        self.title_text = title
        self.value = value

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.title_text, classes="dialog-title")
            yield Input(self.value, select_on_focus=True)
            yield Label("Enter saves · Esc cancels", classes="dialog-hint")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value)


class Confirm(ModalScreen[bool]):
    BINDINGS = [Binding("escape,n", "dismiss(False)", "No"), Binding("y", "dismiss(True)", "Yes")]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.question, classes="dialog-title")
            with Horizontal(classes="buttons"):
                yield Button("Delete (y)", variant="error", id="yes")
                yield Button("Keep (n)", id="no")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")


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
