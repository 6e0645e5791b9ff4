"""What ``dflashd start`` hands the daemon program, and how the program is started.

The client and the daemon are two programs, as supervisorctl and supervisord are: the client
checks the config, the command and the home, then starts ``python -m
dflashd.supervisor.daemon`` with what it checked: in the foreground it replaces itself with it
(``execv``: the same pid, terminal and signals), detached it spawns it in a session of its own.
What it checked travels in an anonymous memory file whose fd the program's command line names;
the program takes the home's lock itself.  The client never loads the daemon's code, and the
daemon never loads the client's.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NoReturn

import orjson

from dflashd.supervisor.host.codecache import settle
from dflashd.supervisor.host.config import Config
from dflashd.supervisor.host.home import Home

DAEMON_MODULE: Final = "dflashd.supervisor.daemon"
HANDOVER_OPTION: Final = "--handover-fd"
# A terminal's two stops (Ctrl-C, Ctrl-\): a script's background job begins with them ignored,
# and a program is expected to keep that (inbox.py for the daemon, start.py for the client).
TERMINAL_STOPS: Final = (signal.SIGINT, signal.SIGQUIT)
HELD_WHILE_LOADING: Final = frozenset({*TERMINAL_STOPS, signal.SIGTERM, signal.SIGHUP})


# what the daemon calls with its first launch's report: the ready pipe, or one line (foreground.py)
FirstLaunch = Callable[[dict[str, Any]], None]


class HandoverError(Exception):
    """The daemon program was started without a readable hand-over (by hand, or broken)."""


@dataclass(frozen=True, slots=True)
class Handover:
    """A checked start: the home, the config, the ready pipe of a detached ``start`` (None in
    a terminal or a unit), how the job's output is echoed on the daemon's stdout (``echo``
    False: not at all), what ``dflashd restart`` repeats (``saved``: the config file and the
    command as given) and the one-home warning to say once the home is taken."""

    home: Home
    config: Config
    ready_fd: int | None
    echo: bool = False
    raw: bool = False
    color: bool = False
    redraw: bool = True
    saved: tuple[Path | None, tuple[str, ...]] | None = None
    warning: str | None = None


def program_words(handover: Handover) -> list[str]:
    """What the daemon program's command line shows after its hand-over: the start's words
    (``start --foreground --home H … -- CMD…``), so that ``ps`` and ``dflashd ls`` see what runs."""
    words = ["start", "--foreground", "--home", str(handover.home.root)]
    if handover.saved is not None and handover.saved[0] is not None:
        words += ["--config", str(handover.saved[0].absolute())]
    return [*words, "--", *handover.config.command]


def handover_file(handover: Handover) -> int:
    """An fd of an anonymous file holding the hand-over: a memory file, or where the kernel or a
    sandbox has none (ENOSYS, EPERM under some seccomp profiles), an unlinked 0600 file in the
    home; either is inherited by the program and read once there."""
    try:
        fd = os.memfd_create("dflashd-handover", 0)
    except OSError:
        with tempfile.TemporaryFile(dir=handover.home.root) as unnamed:
            fd = os.dup(unnamed.fileno())
    try:
        data = memoryview(pickle.dumps(handover, protocol=pickle.HIGHEST_PROTOCOL))
        while data:
            data = data[os.write(fd, data) :]
    except BaseException:
        os.close(fd)
        raise
    return fd


def _argv(fd: int, handover: Handover) -> list[str]:
    # -P: the job's directory is never searched for modules (a logs.py there would shadow one)
    words = program_words(handover)
    return [sys.executable, "-P", "-m", DAEMON_MODULE, HANDOVER_OPTION, str(fd), *words]


def become_daemon(handover: Handover) -> NoReturn:
    """Replace this process with the daemon program.  Raises OSError when the exec fails
    (nothing was started)."""
    fd = handover_file(handover)
    try:
        for kept in (fd, *([] if handover.ready_fd is None else [handover.ready_fd])):
            os.set_inheritable(kept, True)
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        # a stop (Ctrl-C or Ctrl-\, a unit's SIGTERM, a closed terminal) while the program
        # loads waits, held back, until its loop takes its signals over (inbox.py): a clean
        # stop, not a traceback or a death with nothing recorded
        signal.pthread_sigmask(signal.SIG_BLOCK, HELD_WHILE_LOADING)
        # what this command compiled of its dataclasses is kept now: an exec runs no exit
        # handler, and a start in a unit never runs another command that would save it
        settle()
        os.execv(sys.executable, _argv(fd, handover))
    finally:  # only when the exec failed
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD_WHILE_LOADING)
        os.close(fd)


def spawn_daemon(handover: Handover, *, log_fd: int, env: dict[str, str] | None) -> None:
    """Start the daemon program detached: its own session, stdin from /dev/null, stdout and
    stderr to ``log_fd`` (daemon.log), ``env`` (None: this process's)."""
    fd = handover_file(handover)
    try:
        ready = () if handover.ready_fd is None else (handover.ready_fd,)
        subprocess.Popen(
            _argv(fd, handover),
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            pass_fds=(fd, *ready),
            env=env,
            start_new_session=True,  # the mask it inherits is cleared by the daemon (inbox.py)
        )
    finally:
        os.close(fd)


def take_handover(argv: list[str]) -> Handover:
    """The hand-over named on the daemon program's command line (``--handover-fd N …``),
    read and closed; the ready pipe is made private again (the job inherits it never)."""
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
    except Exception as exc:  # anything an fd not of `start` may hold: one line, exit 2
        raise HandoverError(f"cannot read the hand-over of `dflashd start`: {exc}") from None
    if not isinstance(handover, Handover):
        raise HandoverError("the hand-over of `dflashd start` is not one")
    if handover.ready_fd is not None:
        os.set_inheritable(handover.ready_fd, False)
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
