"""A scheduled reply seen from the event loop: text pieces to await, cancelled when the client goes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence

from localchat.scheduler import ReplyDone, ReplyEvent, ReplyFailed, ScheduledReply, Scheduler, TextDelta
from localchat.session import GenerationSettings, GenerationStats


class ReplyFailedError(Exception):
    """The backend failed while producing the reply (a server fault, not the client's)."""


class PendingReply:
    """Submits a reply to the scheduler and hands its events over to the running event loop."""

    def __init__(
        self,
        scheduler: Scheduler,
        prompt: Sequence[int],
        settings: GenerationSettings,
        on_done: Callable[[GenerationStats], None],
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._events: asyncio.Queue[ReplyEvent] = asyncio.Queue()
        self._on_done = on_done
        self.stats: GenerationStats | None = None
        # Raises QueueFullError or ContextOverflowError before anything is sent to the client.
        self._handle: ScheduledReply = scheduler.submit(prompt, settings, self._deliver)

    def _deliver(self, event: ReplyEvent) -> None:
        """Where the scheduler steps (llama.cpp's compute thread)."""
        if isinstance(event, ReplyDone):
            self._on_done(event.stats)
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)
        except RuntimeError:
            # The event loop is closed (the server stopped mid-reply): nobody is left to tell.
            return

    def cancel(self) -> None:
        self._handle.cancel()

    async def deltas(self) -> AsyncIterator[TextDelta]:
        """The reply's text pieces (with their tokens' log-probabilities when asked for); `stats`
        is set once they end. Leaving early cancels the reply."""
        try:
            while True:
                event = await self._events.get()
                if isinstance(event, TextDelta):
                    yield event
                elif isinstance(event, ReplyDone):
                    self.stats = event.stats
                    return
                elif isinstance(event, ReplyFailed):
                    raise ReplyFailedError(event.message)
        finally:
            if self.stats is None:
                self._handle.cancel()
