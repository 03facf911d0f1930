"""Work on a thread of its own, its result or error kept in a Future."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")


def started(work: Callable[[], T], name: str) -> Future[T]:
    """`work`, run on a daemon thread named `name` started now. The work must import nothing new:
    two threads importing at once can see each other's modules half made."""
    future: Future[T] = Future()

    def run() -> None:
        try:
            future.set_result(work())
        except BaseException as error:
            future.set_exception(error)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future
