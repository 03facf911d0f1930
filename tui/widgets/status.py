"""The one-line status bar: speed, latency, context use, memory, backend and model."""

from __future__ import annotations

from rich.cells import cell_len
from rich.console import RenderableType
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from localchat.chat_engine import ChatEngine

MIB = 1024**2
GAP = "  "


def _size(n_bytes: int) -> str:
    return f"{n_bytes / 1024**3:.1f}G" if n_bytes >= 1024**3 else f"{n_bytes / MIB:.0f}M"


class StatusBar(Widget):
    """Live numbers on the left, backend and model on the right.

    When the bar is too narrow, the backend's name goes first, then the time to first token,
    then the model's name is cut: speed, context and memory always stay whole (in a compact form
    in a small terminal)."""

    state: reactive[str] = reactive("starting")
    tokens_per_s: reactive[float | None] = reactive(None)
    ttft_s: reactive[float | None] = reactive(None)
    context_used: reactive[int] = reactive(0)
    context_size: reactive[int] = reactive(0)
    left_out: reactive[int] = reactive(0)  # messages the prompt leaves out to fit the context
    rss_bytes: reactive[int] = reactive(0)
    gpu_bytes: reactive[int | None] = reactive(None)
    backend: reactive[str] = reactive("")
    model: reactive[str] = reactive("")

    def show_engine(self, engine: ChatEngine, gpu_bytes: int | None) -> None:
        """A model is ready: its backend, name and context size, and the GPU memory in use (None
        when it runs on no GPU)."""
        self.state = "ready"
        self.backend = engine.backend_label
        self.model = engine.model_name
        self.context_size = engine.context_size or 0
        self.gpu_bytes = gpu_bytes

    def numbers(self, *, ttft: bool = True, compact: bool = False) -> str:
        """The live figures; `compact` for a small terminal: one space between them, shorter units."""
        parts = [self.state]
        if self.tokens_per_s is not None:
            parts.append(f"{self.tokens_per_s:.1f}{'t/s' if compact else ' tok/s'}")
        if ttft and self.ttft_s is not None:
            parts.append(f"TTFT {self.ttft_s:.2f}s")
        if self.context_size:
            left_out = f" ({self.left_out}{' out' if compact else ' left out'})" if self.left_out else ""
            parts.append(f"ctx {self.context_used}/{self.context_size}{left_out}")
        if self.rss_bytes:
            parts.append(f"RAM {_size(self.rss_bytes)}")
        if self.gpu_bytes is not None:
            parts.append(f"GPU {_size(self.gpu_bytes)}")
        return (" " if compact else GAP).join(parts)

    def line(self, width: int) -> Text:
        """The bar's text for `width` cells: the first layout that fits, else the figures without the
        time to first token (compact where even those do not fit) and the model's name cut to the
        room left."""
        full = self.numbers()
        layouts = [(full, f"{self.backend} · {self.model}"), (full, self.model), (self.numbers(ttft=False), self.model)]
        if not self.backend:  # no model loaded yet
            layouts = [(full, "")]
        for left, right in layouts:
            if cell_len(left) + len(GAP) * bool(right) + cell_len(right) <= width:
                break
        else:
            if cell_len(left) > width:
                left = self.numbers(ttft=False, compact=True)
        room = width - cell_len(left) - len(GAP)
        right_text = Text(right if room > 1 else "", no_wrap=True)
        right_text.truncate(max(room, 0), overflow="ellipsis")
        text = Text(left, no_wrap=True, overflow="ellipsis")
        text.append(" " * max(width - cell_len(left) - right_text.cell_len, 0))
        text.append_text(right_text)
        return text

    def render(self) -> RenderableType:
        return self.line(self.content_size.width)
