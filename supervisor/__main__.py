"""``python -m dflashd.supervisor`` and the ``dflashd`` command (the detached daemon re-executes
it).  A Ctrl-C while the command is still loading its modules (a few hundred milliseconds on a
cold cache: the moment a user often interrupts ``start``) ends it with one line and exit 130,
never a traceback."""

from __future__ import annotations

import signal
import sys

EXIT_INTERRUPTED = 130  # as dflashd.supervisor.exitcodes, not imported yet here


def main(prog_name: str | None = None) -> None:
    """Load the command line, then run it."""
    try:
        from dflashd.supervisor.client.cli import main as command_line
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # one Ctrl-C said it: more change nothing
        sys.stderr.write("\ndflashd: interrupted before it started: nothing was done\n")
        raise SystemExit(EXIT_INTERRUPTED) from None
    command_line(prog_name=prog_name)


if __name__ == "__main__":
    main()
