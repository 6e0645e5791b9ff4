"""Process groups: what the daemon may do to processes, and only to those it started.

:class:`ProcessOps` is the seam: the daemon launches, reaps and signals through it, so the
loop tests drive the real daemon logic with a scripted stand-in and no process is touched.
:class:`HostProcesses` is the real thing.  Every signal goes to a process group or a pid
the daemon started (or proved to be a descendant of one); never a name or a pattern.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

from dflashd.supervisor.launch import Launched, group_alive, signal_group, spawn


class ProcessOps(Protocol):
    """What the daemon does to processes."""

    def spawn(self, argv: tuple[str, ...], *, cwd: Path, env: Mapping[str, str]) -> Launched:
        """Fork and exec in a new session; OSError when exec fails."""
        ...

    def wait_nohang(self, pid: int) -> int | None:
        """The wait status of our child ``pid`` if it ended, None while it lives.

        Raises ChildProcessError when the status can no longer be known.
        """
        ...

    def signal_group(self, pgid: int, signum: int) -> bool:
        """Signal a process group we started; False when nothing is left in it."""
        ...

    def kill(self, pid: int, signum: int) -> bool:
        """Signal one process; False when it is gone."""
        ...

    def group_alive(self, pgid: int) -> bool:
        """True while any member of the group exists."""
        ...

    def group_members(self, pgid: int) -> set[int]:
        """Live (non-zombie) members of the group."""
        ...

    def pgid(self, pid: int) -> int | None:
        """The process group of ``pid`` (None when it is gone)."""
        ...

    def live_children(self, pid: int) -> set[int]:
        """The live (non-zombie) children of ``pid``; of the daemon itself: orphans it adopted too."""
        ...

    def descends_from(self, pid: int, root: int) -> bool:
        """True when ``root`` is among the parents of ``pid``."""
        ...

    def create_time(self, pid: int) -> float | None:
        """When ``pid`` was created (seconds since the epoch), None when it is gone."""
        ...

    def cmdline(self, pid: int) -> str:
        """The command line of ``pid``, for naming it in the log."""
        ...

    def reap_orphans(self, keep: set[int]) -> None:
        """Reap zombie children (orphans we inherited as subreaper), except ``keep``."""
        ...


class HostProcesses:
    """The real processes of this host."""

    def spawn(self, argv: tuple[str, ...], *, cwd: Path, env: Mapping[str, str]) -> Launched:
        """See :func:`dflashd.supervisor.launch.spawn`."""
        return spawn(argv, cwd=cwd, env=env)

    def wait_nohang(self, pid: int) -> int | None:
        """``waitpid(pid, WNOHANG)``."""
        got, status = os.waitpid(pid, os.WNOHANG)
        return status if got == pid else None

    def signal_group(self, pgid: int, signum: int) -> bool:
        """``killpg``."""
        return signal_group(pgid, signum)

    def kill(self, pid: int, signum: int) -> bool:
        """``kill``."""
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def group_alive(self, pgid: int) -> bool:
        """``killpg(pgid, 0)``."""
        return group_alive(pgid)

    def group_members(self, pgid: int) -> set[int]:
        """A scan of /proc (through psutil) for the group's live members."""
        import psutil

        members: set[int] = set()
        for proc in psutil.process_iter(["pid", "status"]):
            try:
                if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                    members.add(proc.pid)
            except (OSError, psutil.Error):
                continue
        return members

    def pgid(self, pid: int) -> int | None:
        """``getpgid``."""
        try:
            return os.getpgid(pid)
        except OSError:
            return None

    def live_children(self, pid: int) -> set[int]:
        """psutil's children, zombies left out."""
        import psutil

        try:
            found = psutil.Process(pid).children()
        except psutil.Error:
            return set()
        live: set[int] = set()
        for child in found:
            try:
                if child.status() != psutil.STATUS_ZOMBIE:
                    live.add(child.pid)
            except psutil.Error:
                continue
        return live

    def descends_from(self, pid: int, root: int) -> bool:
        """Walk the parents of ``pid``."""
        import psutil

        try:
            return any(parent.pid == root for parent in psutil.Process(pid).parents())
        except psutil.Error:
            return False

    def create_time(self, pid: int) -> float | None:
        """psutil's create time."""
        import psutil

        try:
            return float(psutil.Process(pid).create_time())
        except psutil.Error:
            return None

    def cmdline(self, pid: int) -> str:
        """psutil's cmdline, joined and cut at 200 characters."""
        import psutil

        try:
            return " ".join(psutil.Process(pid).cmdline())[:200]
        except psutil.Error:
            return "?"

    def reap_orphans(self, keep: set[int]) -> None:
        """See :func:`reap_orphans`."""
        reap_orphans(keep)


def reap_any() -> None:
    """Reap every zombie child we have (shutdown and recovery only)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def term_then_kill(
    send: Callable[[int], object], gone: Callable[[], bool], timeout_s: float
) -> None:
    """``send(SIGTERM)``, wait until ``gone()``, ``send(SIGKILL)`` after ``timeout_s``.

    Blocking (shutdown and start-up only).  Polls: the processes are grandchildren or a
    previous daemon's, not children this process can wait on, so no event exists.
    """
    send(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        reap_any()
        if gone():
            return
        time.sleep(0.05)
    send(signal.SIGKILL)
    reap_any()


def terminate_group(ops: ProcessOps, pgid: int, timeout_s: float) -> None:
    """SIGTERM a group we started, SIGKILL what is left after ``timeout_s``."""
    term_then_kill(
        lambda sig: ops.signal_group(pgid, sig), lambda: not ops.group_members(pgid), timeout_s
    )


def kill_own_descendants(exclude: set[int]) -> None:
    """At exit: SIGKILL every descendant still ours (as subreaper), except ``exclude`` (alert commands)."""
    import psutil

    try:
        children = [p for p in psutil.Process().children(recursive=True) if p.pid not in exclude]
    except psutil.Error:
        return
    for child in children:
        try:
            child.kill()
        except psutil.Error:
            pass


def reap_orphans(keep: set[int]) -> None:
    """As subreaper, orphaned grandchildren are ours: reap the zombies, except the pids in ``keep``."""
    import psutil

    try:
        children = psutil.Process().children()
    except psutil.Error:
        return
    for child in children:
        if child.pid in keep:
            continue
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(child.pid, os.WNOHANG)
        except (psutil.Error, ChildProcessError):
            continue
