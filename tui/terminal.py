"""The terminal under the app when it goes away: Textual's driver for Linux and macOS, writing to
an output that a closed terminal window does not break.

When the window closes, the terminal hangs up: every write to it fails with EIO. In Textual's
driver that error ends the thread that writes the screen, and the app's next writes then wait for
it forever, so the app told to quit (SIGHUP) stores the reply and hangs at exit, holding the
model's memory. Here the screen goes nowhere instead, and the app exits.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import Any, TextIO

from textual.app import App
from textual.driver import Driver
from textual.drivers.linux_driver import LinuxDriver


class TerminalOutput:
    """A terminal's output that drops what it is given once the terminal has hung up."""

    def __init__(self, terminal: TextIO) -> None:
        self._terminal = terminal
        self._hung_up = False

    def _attempt(self, call: Callable[..., object], *args: str) -> None:
        if self._hung_up:
            return
        try:
            call(*args)
        except OSError as error:
            if error.errno != errno.EIO:
                raise
            self._hung_up = True

    def write(self, text: str) -> None:
        self._attempt(self._terminal.write, text)

    def flush(self) -> None:
        self._attempt(self._terminal.flush)

    def fileno(self) -> int:
        return self._terminal.fileno()


class TerminalDriver(LinuxDriver):
    """Textual's LinuxDriver, its screen written through TerminalOutput."""

    def __init__(self, app: App[Any], **options: Any) -> None:
        super().__init__(app, **options)
        self._file = TerminalOutput(self._file)  # what its writer thread writes to (sys.__stderr__)


def terminal_driver(chosen: type[Driver]) -> type[Driver]:
    """TerminalDriver where Textual chose its LinuxDriver; another one (TEXTUAL_DRIVER's) as chosen."""
    return TerminalDriver if chosen is LinuxDriver else chosen
