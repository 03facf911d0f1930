"""`python -m localchat` and the `localchat` command (pyproject.toml's entry point)."""

import sys

from localchat.interrupts import quiet_while_starting


def command() -> int:
    """The command, made quiet to Ctrl-C before its modules are imported: while they import and its
    arguments are parsed, Ctrl-C ends it with 130 and no traceback, as it does later."""
    quiet_while_starting()
    from localchat.cli import command as run_command

    return run_command()


if __name__ == "__main__":
    sys.exit(command())
