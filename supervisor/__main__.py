"""``python -m dflashd.supervisor`` and the ``dflashd`` command (the detached daemon re-executes
it).  A Ctrl-C while the command is still loading its modules (a few hundred milliseconds on a
cold cache: the moment a user often interrupts ``start``) ends it with one line and exit 130,
never a traceback: the handler itself says so and exits, so no code in between can swallow it.
It is set before anything else of dflashd is loaded (the package's ``__init__`` loads nothing
for the command), the cache of the dataclasses' code (``host/codecache.py``) right after it.

A command started with SIGINT ignored (a script's background job: ``dflashd start … &``) keeps
it ignored, as shells and ``nohup``-style wrappers expect of every program: a Ctrl-C meant for
the script's foreground never ends it, at whatever moment it comes.
"""

from __future__ import annotations

import os
import sys

EXIT_INTERRUPTED = 130  # as dflashd.supervisor.model.exitcodes, not imported yet here
# The C module CPython loaded at start to install its own SIGINT handler: ours is set through
# it with no import (``signal`` first builds its enums: milliseconds on a cold cache, in which
# a Ctrl-C was a traceback from enum.py).
_signal = sys.modules.get("_signal") or __import__("signal")


def interrupted_while_loading(signum: int, frame: object) -> None:
    """SIGINT before the command has taken over: nothing was done yet."""
    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)
    os.write(2, b"\ndflashd: interrupted before it started: nothing was done\n")
    os._exit(EXIT_INTERRUPTED)


def main(prog_name: str | None = None) -> None:
    """Load the command line, then run it (the command decides what a Ctrl-C does next)."""
    if _signal.getsignal(_signal.SIGINT) != _signal.SIG_IGN:  # ignored when started: kept so
        _signal.signal(_signal.SIGINT, interrupted_while_loading)
    from dflashd.supervisor.host import codecache  # imports dataclasses: under the handler

    codecache.install()  # before the modules that make their dataclasses
    from dflashd.supervisor.client.cli import main as command_line

    command_line(prog_name=prog_name)


if __name__ == "__main__":
    main()
