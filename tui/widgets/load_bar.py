"""The line under the conversation while a model loads: which model, and how far it is."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Label, ProgressBar


class LoadBar(Horizontal):
    def compose(self) -> ComposeResult:
        yield Label("Loading", id="load-label")
        yield ProgressBar(total=1.0, show_eta=False)

    def start(self, label: str) -> None:
        self.query_one("#load-label", Label).update(f"Loading {label}")
        self.query_one(ProgressBar).update(progress=0)
        self.display = True

    def progress(self, fraction: float) -> None:
        self.query_one(ProgressBar).update(progress=fraction)
