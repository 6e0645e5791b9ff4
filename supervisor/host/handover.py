"""What ``dflashd start --foreground`` hands the daemon program it becomes, and the becoming.

The client and the daemon are two programs, as supervisorctl and supervisord are: the client
checks the config and the home and takes the home's lock, then replaces itself (``execv``,
the same pid, the same terminal and the same signals) with ``python -m
dflashd.supervisor.daemon``.  What it checked travels in an anonymous memory file whose fd
the new program is told on its command line; the lock and the ready pipe travel as open fds.
The client never loads the daemon's code, and the daemon never loads the client's.
"""

from __future__ import annotations

import os
import pickle
import sys
from dataclasses import dataclass
from typing import Any, Final, NoReturn

import orjson

from dflashd.supervisor.host.config import Config
from dflashd.supervisor.host.home import Home

DAEMON_MODULE: Final = "dflashd.supervisor.daemon"
HANDOVER_OPTION: Final = "--handover-fd"


class HandoverError(Exception):
    """The daemon program was started without a readable hand-over (by hand, or broken)."""


@dataclass(frozen=True, slots=True)
class Handover:
    """A checked start: the home, its lock (an open fd holding the flock), the config, the
    ready pipe of a detached ``start`` (None in a terminal or a unit), and how the job's
    output is echoed on the daemon's stdout (``echo`` False: not at all)."""

    home: Home
    config: Config
    lock_fd: int
    ready_fd: int | None
    echo: bool
    raw: bool = False
    color: bool = False
    redraw: bool = True


def become_daemon(handover: Handover, shown: list[str]) -> NoReturn:
    """Replace this process with the daemon program; ``shown``: the words after the module
    on its command line (``start --foreground --home …``), so that ``ps`` and ``dflashd ls``
    see what runs.  Raises OSError when the exec fails (nothing was started)."""
    fd = os.memfd_create("dflashd-handover", 0)  # inherited across the exec, read once there
    try:
        os.write(fd, pickle.dumps(handover, protocol=pickle.HIGHEST_PROTOCOL))
        ready = [] if handover.ready_fd is None else [handover.ready_fd]
        passed = [fd, handover.lock_fd, *ready]
        for kept in passed:
            os.set_inheritable(kept, True)
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        # -P: the job's directory is never searched for modules (a train/logs.py there
        # would otherwise shadow one of the daemon's)
        argv = [sys.executable, "-P", "-m", DAEMON_MODULE, HANDOVER_OPTION, str(fd), *shown]
        os.execv(sys.executable, argv)
    except BaseException:
        os.close(fd)
        os.set_inheritable(handover.lock_fd, False)
        raise


def take_handover(argv: list[str]) -> Handover:
    """The hand-over named on the daemon program's command line (``--handover-fd N …``),
    read and closed; the fds it names are made private again (the job inherits none)."""
    if len(argv) < 2 or argv[0] != HANDOVER_OPTION or not argv[1].isdigit():
        raise HandoverError(
            "the daemon program is started by `dflashd start`, not by hand "
            "(use `dflashd start --foreground` for a daemon in this terminal)"
        )
    fd = int(argv[1])
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        with os.fdopen(fd, "rb") as memory:
            handover = pickle.load(memory)
    except (OSError, EOFError, pickle.UnpicklingError) as exc:
        raise HandoverError(f"cannot read the hand-over of `dflashd start`: {exc}") from None
    if not isinstance(handover, Handover):
        raise HandoverError("the hand-over of `dflashd start` is not one")
    for kept in (handover.lock_fd, handover.ready_fd):
        if kept is not None:
            os.set_inheritable(kept, False)
    return handover


def report_ready(fd: int | None, info: dict[str, Any]) -> None:
    """One JSON line to the detached ``start`` waiting on the ready pipe, which is then
    closed (None: a start in a terminal or a unit, no one waits)."""
    if fd is None:
        return
    try:
        os.write(fd, orjson.dumps(info) + b"\n")
        os.close(fd)
    except OSError:
        pass
