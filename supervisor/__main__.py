"""``python -m dflashd.supervisor`` and the ``dflashd`` command (the detached daemon re-executes
it).  A Ctrl-C while the command is still loading its modules (a few hundred milliseconds on a
cold cache: the moment a user often interrupts ``start``) ends it with one line and exit 130,
never a traceback: the handler itself says so and exits, so no code in between can swallow it.
It is set by the package's ``__init__``, the first of dflashd that runs (``python -m``, the
``dflashd`` script), and again here for an entry that check does not know (a script of
another name); the cache of the dataclasses' code (``host/codecache.py``) right after it.

A command started with SIGINT ignored (a script's background job: ``dflashd start … &``) keeps
it ignored, as shells and ``nohup``-style wrappers expect of every program: a Ctrl-C meant for
the script's foreground never ends it, at whatever moment it comes.
"""

from __future__ import annotations

from dflashd.supervisor import hold_ctrl_c_while_loading  # the package: loaded, and light


def main(prog_name: str | None = None) -> None:
    """Load the command line, then run it (the command decides what a Ctrl-C does next)."""
    hold_ctrl_c_while_loading()  # again, for an entry the package's check does not know
    from dflashd.supervisor.host import codecache  # imports dataclasses: under the handler

    codecache.install()  # before the modules that make their dataclasses
    from dflashd.supervisor.client.cli import main as command_line

    command_line(prog_name=prog_name)


if __name__ == "__main__":
    main()
