"""A reply as it is written: the worker that runs its generation in a thread and posts the text and
the live numbers to the app, and the drawing of what it posted (content into the answer,
reasoning into the folded block above it)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from textual.message import Message
from textual.worker import get_current_worker

from localchat.conversation import Turn
from localchat.errors import LocalchatError
from localchat.reply_parser import ContentDelta, ParsedReply, ReasoningDelta, ReplyParser, ReplyPart
from localchat.tui.widgets.messages import FINISH_NOTES, AssistantMessage, ConversationView, Reasoning

# Text reaches the screen at most this often; MarkdownStream merges what piles up in between. Each frame
# costs the app's thread a layout and a redraw (about 10 ms at 80x24), taken from the cores that decode: in
# the app on the default model (AMD EPYC, 2 cores, 300-token replies alternating), 10 frames a second decoded
# 1.11x as fast as 30 (8 and 6 rounds), 15 a second 1.06x, and text shown only at the end 1.30x.
FRAME_S = 0.1
# The status bar's live numbers (tokens/s, context) update this often while a reply is written.
STATS_S = 0.25


# Messages from the reply's worker to the app.


@dataclass
class ReplyText(Message):
    text: str


@dataclass
class ReplyStats(Message):
    tokens_per_s: float
    ttft_s: float | None
    context_used: int | None


@dataclass
class ReplyEnded(Message):
    error: str | None


@dataclass
class Reply:
    """A reply being generated (the turn that stores it) and where it is drawn."""

    turn: Turn
    view: ConversationView
    widget: AssistantMessage
    parser: ReplyParser  # the text as it reaches the view -> reasoning and content
    parsed: ParsedReply = field(default_factory=ParsedReply)
    thinking: Reasoning | None = None  # mounted above the answer once reasoning arrives
    done: threading.Event = field(default_factory=threading.Event)

    @classmethod
    async def start(cls, turn: Turn, view: ConversationView) -> Reply:
        """An empty answer at the bottom of the view, streaming."""
        widget = AssistantMessage()
        await view.mount(widget)
        await widget.start_stream()
        view.scroll_end(animate=False)
        return cls(turn, view, widget, turn.chat.reply_parser())

    def live_stats(self) -> ReplyStats:
        generation = self.turn.generation
        ttft = generation.first_token_at - generation.started_at if generation.first_token_at else None
        return ReplyStats(generation.tokens_per_second, ttft, self.turn.chat.context_used())

    async def show(self, text: str) -> None:
        await self._show_parts(self.parser.feed(text))

    async def _show_parts(self, parts: list[ReplyPart]) -> None:
        content = ""
        for part in parts:
            self.parsed.add(part)
            if isinstance(part, ContentDelta):
                content += part.text
            elif isinstance(part, ReasoningDelta) and self.widget.is_attached:
                if self.thinking is None:
                    self.thinking = Reasoning()
                    await self.view.mount(self.thinking, before=self.widget)
                self.thinking.write(part.text)
        if content and self.widget.is_attached:
            await self.widget.write(content)

    async def end(self, error: str | None, token_count: Callable[[str], int | None]) -> None:
        """Store what was written and draw the answer once, whole, with a note on how it ended."""
        stats = self.turn.generation.stats
        await self._show_parts(self.parser.finish())
        content, reasoning = self.parsed.content, self.parsed.reasoning
        finish = stats.finish_reason if stats is not None else ""
        # The note comes back with the conversation.
        self.turn.end(content, reasoning, finish if not error and finish in FINISH_NOTES else None)
        if error:
            note = f"error: {error} (Ctrl+R tries again)"
        else:
            note = FINISH_NOTES.get(finish, "")
        await self.widget.end_stream()
        if self.thinking is not None and self.thinking.is_attached:
            self.thinking.finish(token_count(reasoning))
        if self.widget.is_attached:  # not when the user switched conversations meanwhile
            await self.widget.finish(content, note)


def write_reply(reply: Reply, post: Callable[[Message], object]) -> None:
    """The reply's worker, in its thread: runs the generation and posts its text (at most every
    FRAME_S), its numbers (every STATS_S) and its end; never touches a widget. The pieces come where
    the engine computes (ChatGeneration.stream), and posting them waits for nothing."""
    worker = get_current_worker()
    generation = reply.turn.generation
    pending: list[str] = []
    # The first text goes at once: pacing the frames must not hold back the first token.
    last_text, last_stats = -math.inf, time.monotonic()

    def show(piece: str) -> None:
        nonlocal last_text, last_stats
        pending.append(piece)
        now = time.monotonic()
        if now - last_text >= FRAME_S:
            post(ReplyText("".join(pending)))
            pending.clear()
            last_text = now
        if now - last_stats >= STATS_S:
            post(reply.live_stats())
            last_stats = now
        if worker.is_cancelled:
            generation.cancel()

    error = None
    try:
        generation.stream(show)
    except LocalchatError as failure:
        error = str(failure)
    finally:
        if pending:
            post(ReplyText("".join(pending)))
        reply.done.set()
        post(ReplyEnded(error))
