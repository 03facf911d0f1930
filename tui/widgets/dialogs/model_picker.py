"""Modal screens: help, model picker (with pulls from the hub), rename, delete confirmation, system prompt."""

from __future__ import annotations

from dataclasses import dataclass

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import (
    Button,
    Input,
    Label,
    OptionList,
    ProgressBar,
    Static,
    TextArea,
)
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
    model: str | None  # what Engine.load takes: None for the default model, else a path or a hub name
    detail: str


def _mib(n_bytes: int) -> str:
    return f"{n_bytes / 2**20:,.1f} MiB"


class ModelPicker(ModalScreen["ModelChoice | None"]):
    """The models on this machine, and a field to pull one from the hub by name. The app does the
    pull and tells the dialog how it goes; Esc (or the button) cancels a pull, else the dialog."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    @dataclass
    class PullAsked(Message):
        name: str

    class CancelAsked(Message):
        pass

    def __init__(self, choices: list[ModelChoice], current: str | None) -> None:
        super().__init__()
        self.choices = choices
        self.current = current
        self.pulling: str | None = None  # the name being pulled

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="model-picker"):
            yield Label("Choose a model", classes="dialog-title")
            yield OptionList()
            yield Input(placeholder="or pull one: user/repo:QUANT, then Enter", id="pull-name")
            with Horizontal(id="pull"):
                yield ProgressBar(show_eta=False)
                yield Button("Cancel pull", id="cancel-pull", compact=True)
            yield Label("", id="pull-status", markup=False)
            yield Label("Enter loads it · Tab goes to the pull field · Esc cancels", classes="dialog-hint")

    def on_mount(self) -> None:
        self.query_one("#pull").display = False
        self.query_one("#pull-status").display = False
        self.show_choices(self.choices, self.current)
        self.query_one(OptionList).focus()

    def show_choices(self, choices: list[ModelChoice], highlight: str | None) -> None:
        self.choices = choices
        options = self.query_one(OptionList)
        options.clear_options()
        options.add_options(Option(f"{c.label}  [dim]{c.detail}[/]", id=str(i)) for i, c in enumerate(choices))
        labels = [c.label for c in choices]
        if highlight in labels:
            options.highlighted = labels.index(highlight)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(self.choices[int(event.option.id or 0)])

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if event.value.strip() and self.pulling is None:
            self.post_message(self.PullAsked(event.value.strip()))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.action_cancel()

    def action_cancel(self) -> None:
        if self.pulling is None:
            self.dismiss(None)
        else:
            self._say(f"Cancelling the pull of {self.pulling}…")
            self.post_message(self.CancelAsked())

    # What the app tells the dialog about a pull:

    def pull_started(self, name: str) -> None:
        self.pulling = name
        self.query_one("#pull").display = True
        self.query_one(ProgressBar).update(total=None, progress=0)
        self._say(f"Pulling {name}…")

    def pull_progress(self, done: int, total: int | None) -> None:
        self.query_one(ProgressBar).update(total=total, progress=done)
        self._say(f"Pulling {self.pulling}: {_mib(done)}" + (f" of {_mib(total)}" if total else ""))

    def pull_ended(self, message: str, *, failed: bool) -> None:
        self.pulling = None
        self.query_one("#pull").display = False
        self._say(message, failed=failed)
        if not failed:
            self.query_one(OptionList).focus()

    def _say(self, text: str, *, failed: bool = False) -> None:
        status = self.query_one("#pull-status", Label)
        status.update(text)
        status.set_class(failed, "error")
        status.display = True


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
