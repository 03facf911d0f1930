"""The model picker: the models on this machine, and a field to pull one from the hub by name."""

from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, OptionList, ProgressBar
from textual.widgets.option_list import Option

from localchat.hub import cached_models
from localchat.models import DEFAULT_MODEL_NAME, PACKAGED_MODELS, local_models, packaged_model
from localchat.settings import Settings


@dataclass(frozen=True)
class ModelChoice:
    label: str
    model: str | None  # what Engine.load takes: None for the default model, else a path or a hub name
    detail: str


def model_choices(settings: Settings) -> list[ModelChoice]:
    """The models localchat installs (the default first), every GGUF file and ONNX folder in the models
    directory, and the GGUF models in the Hugging Face cache (by their hub names, which load without the network)."""
    choices = [ModelChoice(name, None, "default") if name == DEFAULT_MODEL_NAME else ModelChoice(name, name, "installed")
               for name in sorted(PACKAGED_MODELS, key=lambda name: name != DEFAULT_MODEL_NAME)]
    for ref in local_models(settings):
        if packaged_model(ref.path) is not None:
            continue  # a packaged model's own copy
        choices.append(ModelChoice(ref.name, str(ref.path), ref.format))
    for cached in cached_models(settings):
        choices.append(ModelChoice(cached.name, cached.name, f"hub · {cached.size / 2**20:,.0f} MiB"))
    return choices


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
