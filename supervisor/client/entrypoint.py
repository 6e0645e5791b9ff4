"""The ``dflashd`` command's entry point: a Ctrl-C while the command is still loading its
modules ends it with one line and exit 130, never a traceback (the imports take a few
hundred milliseconds on a cold cache: the moment a user often interrupts ``start``)."""

from __future__ import annotations

import signal
import sys

EXIT_INTERRUPTED = 130  # as dflashd.supervisor.exitcodes, which is not imported yet


def main(prog_name: str | None = None) -> None:
    """Load the command line, then run it."""
    try:
        from dflashd.supervisor.client.cli import main as command_line
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # one Ctrl-C said it: more change nothing
        sys.stderr.write("\ndflashd: interrupted before it started: nothing was done\n")
        raise SystemExit(EXIT_INTERRUPTED) from None
    command_line(prog_name=prog_name)
