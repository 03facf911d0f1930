"""How the `localchat` command ends on Ctrl-C and SIGTERM. Ctrl-C: at once and quietly while its
modules import and its arguments are parsed (from the entry point on: not while the `localchat`
package itself loads llama.cpp's libraries, the first tens of milliseconds), through KeyboardInterrupt
once it runs, so that what it made is cleaned up. SIGTERM, where a command asks for it: through
KeyboardInterrupt too. Each exits with 128 + the signal's number, as a shell reports a killed command."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

INTERRUPTED_EXIT = 128 + signal.SIGINT


def _end_at_once(_signal: int, _frame: FrameType | None) -> None:
    """Nothing is open while modules import and arguments are parsed. A KeyboardInterrupt there would be a
    traceback, or a RuntimeError where it lands in the making of a class (Python 3.11's __set_name__)."""
    os.write(2, b"\n")  # the line a later Ctrl-C ends with
    os._exit(INTERRUPTED_EXIT)


def quiet_while_starting() -> None:
    """Until `interruptible`, Ctrl-C ends the process at once, quietly. Only Python's own handler is
    replaced: a SIGINT ignored from the start (a job started in the background) stays ignored."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _end_at_once)


def interruptible() -> None:
    """Ctrl-C raises KeyboardInterrupt again, for the command to clean up after it."""
    if signal.getsignal(signal.SIGINT) is _end_at_once:
        signal.signal(signal.SIGINT, signal.default_int_handler)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised as Ctrl-C is so that the same cleanup runs."""

    exit_status = 128 + signal.SIGTERM


def _interrupt(_signal: int, _frame: FrameType | None) -> None:
    raise Terminated


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Inside, SIGTERM raises Terminated, a KeyboardInterrupt as Ctrl-C's, so that what cleans up after Ctrl-C runs
    for it too (by default SIGTERM ends the process on the spot). Main thread only."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
