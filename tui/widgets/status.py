"""The one-line status bar: speed, latency, context use, memory, backend and model."""

from __future__ import annotations

from rich.console import RenderableType
from rich.table import Table
from textual.reactive import reactive
from textual.widget import Widget

MIB = 1024**2


def _size(n_bytes: int) -> str:
    return f"{n_bytes / 1024**3:.1f}G" if n_bytes >= 1024**3 else f"{n_bytes / MIB:.0f}M"


class StatusBar(Widget):
    """Live numbers on the left, backend and model on the right (cut first when narrow)."""

    state: reactive[str] = reactive("starting")
    tokens_per_s: reactive[float | None] = reactive(None)
    ttft_s: reactive[float | None] = reactive(None)
    context_used: reactive[int] = reactive(0)
    context_size: reactive[int] = reactive(0)
    rss_bytes: reactive[int] = reactive(0)
    gpu_bytes: reactive[int | None] = reactive(None)
    backend: reactive[str] = reactive("")
    model: reactive[str] = reactive("")

    def numbers(self) -> str:
        parts = [self.state]
        if self.tokens_per_s is not None:
            parts.append(f"{self.tokens_per_s:.1f} tok/s")
        if self.ttft_s is not None:
            parts.append(f"TTFT {self.ttft_s:.2f}s")
        if self.context_size:
            parts.append(f"ctx {self.context_used}/{self.context_size}")
        if self.rss_bytes:
            parts.append(f"RAM {_size(self.rss_bytes)}")
        if self.gpu_bytes is not None:
            parts.append(f"GPU {_size(self.gpu_bytes)}")
        return "  ".join(parts)

    def render(self) -> RenderableType:
        grid = Table.grid(expand=True, padding=(0, 0, 0, 2))
        grid.add_column(no_wrap=True)
        grid.add_column(justify="right", no_wrap=True, overflow="ellipsis")
        grid.add_row(self.numbers(), f"{self.backend} · {self.model}" if self.backend else "")
        return grid
