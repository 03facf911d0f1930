"""Scheduled replies seen from the event loop: text pieces to await, cancelled when the client goes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from functools import partial

from localchat.scheduler import ReplyDone, ReplyEvent, ReplyFailed, Scheduler, TextDelta
from localchat.session import GenerationSettings, GenerationStats


class ReplyFailedError(Exception):
    """The backend failed while producing the reply, or the server stopped before it ended (a server fault,
    not the client's)."""


STOPPED_MID_REPLY = "the server stopped before the reply ended; send the request again once it is back"


class PendingReplies:
    """Replies submitted together (a request's choices, often one), their events handed over to the
    running event loop, each with its reply's index."""

    def __init__(
        self,
        scheduler: Scheduler,
        replies: Sequence[tuple[Sequence[int], GenerationSettings]],
        on_done: Callable[[GenerationStats], None],
    ) -> None:
        """`replies`: each one's prompt and settings."""
        self._loop = asyncio.get_running_loop()
        self._events: asyncio.Queue[tuple[int, ReplyEvent]] = asyncio.Queue()
        self._on_done = on_done
        self._stats: list[GenerationStats | None] = [None] * len(replies)
        self._cancelled: set[int] = set()  # the replies this request cancelled (others end cancelled as the server stops)
        # Raises QueueFullError or ContextOverflowError before anything is sent to the client.
        self._handles = scheduler.submit_all([(prompt, settings, partial(self._deliver, index))
                                              for index, (prompt, settings) in enumerate(replies)])

    def _deliver(self, index: int, event: ReplyEvent) -> None:
        """Where the scheduler steps (llama.cpp's compute thread)."""
        if isinstance(event, ReplyDone):
            self._on_done(event.stats)
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, (index, event))
        except RuntimeError:
            # The event loop is closed (the server stopped mid-reply): nobody is left to tell.
            return

    def cancel(self, index: int | None = None) -> None:
        """Cancel reply `index`, or every one (None)."""
        indices = range(len(self._handles)) if index is None else [index]
        self._cancelled.update(indices)
        for chosen in indices:
            self._handles[chosen].cancel()

    @property
    def stats(self) -> list[GenerationStats]:
        """Each reply's stats, in order, once `events` has ended."""
        ended = [stats for stats in self._stats if stats is not None]
        assert len(ended) == len(self._stats), "stats asked for before every reply ended"
        return ended

    async def events(self) -> AsyncIterator[tuple[int, TextDelta | ReplyDone]]:
        """Each reply's text pieces (with their tokens' log-probabilities when asked for), then its end,
        as they come, until every reply has ended. A backend failure raises ReplyFailedError, as does a reply
        the server ended as it stopped: its client would otherwise take the text so far for the whole reply.
        Leaving early, or a failure, cancels the replies still running."""
        running = len(self._handles)
        try:
            while running:
                index, event = await self._events.get()
                if isinstance(event, ReplyFailed):
                    raise ReplyFailedError(event.message)
                if isinstance(event, ReplyDone) and event.stats.finish_reason == "cancelled" and index not in self._cancelled:
                    raise ReplyFailedError(STOPPED_MID_REPLY)
                if isinstance(event, ReplyDone):
                    self._stats[index] = event.stats
                    running -= 1
                yield index, event
        finally:
            if running:
                self.cancel()

    async def deltas(self) -> AsyncIterator[tuple[int, TextDelta]]:
        """The text pieces of `events`, each with its reply's index."""
        async for index, event in self.events():
            if isinstance(event, TextDelta):
                yield index, event
