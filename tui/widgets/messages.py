"""The conversation view: one widget per message, the reply being written streamed as Markdown."""

from __future__ import annotations

from collections.abc import Callable

from markdown_it import MarkdownIt
from markdown_it.rules_core import StateCore
from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import Collapsible, Markdown, Static
from textual.widgets._markdown import MarkdownStream

from localchat.history import StoredMessage

EMPTY_REPLY = "*(no answer)*"
WELCOME = "Type a message and press Enter to send it; Ctrl+J adds a new line. F1 lists every key."
UNANSWERED = "This message has no answer: localchat stopped while writing it. Ctrl+R writes one."
# The answer's last line when a reply did not end by itself, by finish reason (kept with the answer).
FINISH_NOTES = {"cancelled": "stopped", "length": "cut off at the length limit"}


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


def _answer_markdown(text: str, note: str) -> str:
    return (text or EMPTY_REPLY) + (f"\n\n*{note}*" if note else "")


class AssistantMessage(Markdown):
    """An answer rendered as Markdown, with a note under it when it was cut short; while it is
    written, fragments go through a MarkdownStream."""

    def __init__(self, text: str = "", note: str = "") -> None:
        super().__init__(_answer_markdown(text, note), parser_factory=chat_markdown_parser)
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
        await self.update(_answer_markdown(text, note))


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

    async def show(self, stored: list[StoredMessage], token_count: Callable[[str], int | None]) -> None:
        """A stored conversation: each answer with its thinking folded above it and its note when it
        was cut short, and a line under a question left unanswered (or a welcome, in an empty
        conversation)."""
        widgets: list[Widget] = []
        for m in stored:
            if m.reasoning:
                widgets.append(Reasoning(m.reasoning, token_count(m.reasoning)))
            if m.role == "user":
                widgets.append(UserMessage(m.content))
            else:
                widgets.append(AssistantMessage(m.content, FINISH_NOTES.get(m.finish or "", "")))
        await self.remove_children()
        if stored and stored[-1].role == "user":
            widgets.append(Notice(UNANSWERED, id="unanswered"))
        await self.mount_all(widgets or [Notice(WELCOME, id="welcome")])
        self.scroll_end(animate=False)

    def mark_context_start(self, left_out: int, n_ctx: int | None) -> None:
        """A line above the first message the model still sees, when older ones are left out of
        its context of `n_ctx` tokens (Chat decides which; the view only shows it)."""
        for old in self.query(ContextStart):
            old.remove()
        shown = self.query("UserMessage, AssistantMessage").nodes
        if left_out <= 0 or left_out >= len(shown) or n_ctx is None:
            return
        self.mount(ContextStart(left_out, n_ctx), before=self.top_of(shown[left_out]))

    def top_of(self, message: Widget) -> Widget:
        """A message's first widget in the view: its thinking, when an answer has some."""
        children = list(self.children)
        index = children.index(message)
        return children[index - 1] if index and isinstance(children[index - 1], Reasoning) else message
