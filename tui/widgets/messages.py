"""The conversation view: one widget per message, the reply being written streamed as Markdown."""

from __future__ import annotations

from markdown_it import MarkdownIt
from markdown_it.rules_core import StateCore
from textual.containers import VerticalScroll
from textual.widgets import Collapsible, Markdown, Static
from textual.widgets._markdown import MarkdownStream

EMPTY_REPLY = "*(no answer)*"


def _keep_line_breaks(state: StateCore) -> None:
    for token in state.tokens:
        for child in token.children or ():
            if child.type == "softbreak":
                child.type = "hardbreak"


def chat_markdown_parser() -> MarkdownIt:
    """GitHub-like Markdown where a single newline breaks the line: models write lists and
    verse with single newlines and expect them kept, as chat apps do."""
    parser = MarkdownIt("gfm-like")
    parser.core.ruler.push("keep_line_breaks", _keep_line_breaks)
    return parser


class UserMessage(Static):
    """What the user wrote, shown as typed (no markup)."""

    def __init__(self, text: str) -> None:
        super().__init__(text, markup=False)
        self.text = text


class AssistantMessage(Markdown):
    """An answer rendered as Markdown; while it is written, fragments go through a MarkdownStream."""

    def __init__(self, text: str = "") -> None:
        super().__init__(text or EMPTY_REPLY, parser_factory=chat_markdown_parser)
        self.text = text
        self._stream: MarkdownStream | None = None

    async def start_stream(self) -> None:
        await self.update("")
        self.add_class("-writing")
        self._stream = self.get_stream(self)

    async def write(self, fragment: str) -> None:
        if self._stream is None:
            await self.start_stream()
        self.text += fragment
        assert self._stream is not None
        await self._stream.write(fragment)

    async def end_stream(self) -> None:
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None

    async def finish(self, text: str, note: str = "") -> None:
        """End the stream and render the whole answer once, which settles any merged fragments."""
        await self.end_stream()
        self.text = text
        self.remove_class("-writing")
        await self.update((text or EMPTY_REPLY) + (f"\n\n*{note}*" if note else ""))


class Reasoning(Collapsible):
    """An answer's thinking, folded above it: closed, it says how long the model thought; Enter
    or a click opens it."""

    def __init__(self, text: str = "", tokens: int | None = None) -> None:
        self.text = text
        self._body = Static(text, markup=False)
        super().__init__(self._body, title=self._heading(tokens) if text else "Thinking…", collapsed=True)

    @staticmethod
    def _heading(tokens: int | None) -> str:
        return "Thought" if tokens is None else f"Thought for {tokens} token{'s' if tokens != 1 else ''}"

    def write(self, fragment: str) -> None:
        self.text += fragment
        self._body.update(self.text)

    def finish(self, tokens: int | None) -> None:
        self.title = self._heading(tokens)


class Notice(Static):
    """A line from the app itself: welcome text, a load error, a stopped reply."""


class ContextStart(Static):
    """Where the model's view of the conversation starts: the messages above it no longer fit
    its context and are left out of the prompt (they stay in the history)."""

    def __init__(self, left_out: int, n_ctx: int) -> None:
        plural = "s" if left_out > 1 else ""
        super().__init__(
            f"↑ {left_out} earlier message{plural} left out: the model sees from here on "
            f"(its context holds {n_ctx} tokens)"
        )
        self.left_out = left_out


class ConversationView(VerticalScroll):
    """The messages of the open conversation, newest at the bottom."""

    def on_mount(self) -> None:
        self.anchor()
