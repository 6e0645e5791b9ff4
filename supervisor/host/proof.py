"""Proof of a process's identity: pidfds, members proven by (pid, start time), and the
custody interface every run is held through.  Nothing here sends a signal (that is
:mod:`custody`'s alone): this is opening pidfds, proving and waiting.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final, Protocol

from dflashd.supervisor.host.procfs import ProcStat, all_stats, carries_mark, read_stat

NO_PIDFD: Final = -1  # the kernel has no pidfds: identity is proven again before each signal


def probe_pidfd() -> bool:
    try:
        fd = os.pidfd_open(os.getpid())
    except (OSError, AttributeError):
        return False
    os.close(fd)
    return hasattr(signal, "pidfd_send_signal")


# DFLASHD_CUSTODY=pid forces the no-pidfd path (as on gVisor), =pidfd forces pidfds over a cgroup.
PIDFD_SUPPORTED: Final = os.environ.get("DFLASHD_CUSTODY") != "pid" and probe_pidfd()
MODE_PID: Final = "pid"  # pidfd mode on a kernel without pidfds (before 5.3, gVisor)


def pidfd_open(pid: int) -> int | None:
    """A pidfd for ``pid`` (``NO_PIDFD`` where the kernel has none), None when it is gone."""
    if not PIDFD_SUPPORTED:
        return NO_PIDFD
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def close_fd(fd: int) -> None:
    if fd >= 0:
        with contextlib.suppress(OSError):
            os.close(fd)


def poll_exits(members: Iterable[Member], timeout_s: float) -> None:
    """Wait until one of ``members`` exits (its pidfd turns readable), at most ``timeout_s``."""
    poller = select.poll()
    blind = False
    for member in members:
        if member.pidfd >= 0:
            poller.register(member.pidfd, select.POLLIN)
        else:
            blind = True
    poller.poll(min(timeout_s, 0.05) * 1000 if blind else timeout_s * 1000)


@dataclass(slots=True)
class Member:
    """One proven process: its pid, its start (identity), its pidfd."""

    pid: int
    start_ticks: int
    pidfd: int
    pgid: int

    def alive(self) -> bool:
        """Still this very process, and not a zombie."""
        found = read_stat(self.pid)
        return found is not None and found.start_ticks == self.start_ticks and found.state != "Z"


class RunCustody(Protocol):
    """What the daemon may do to one run's processes, and to nothing else."""

    mode: str
    root_pid: int

    def members(self) -> set[int]:
        """The run's live processes, proven (the root included while it lives)."""
        ...

    def owns(self, pid: int) -> bool:
        """Is ``pid`` one of the run's processes (proven now, or proven before and alive)?"""
        ...

    def signal_root(self, signum: int) -> bool:
        """The child itself (its pidfd); False once it is gone."""
        ...

    def signal_group(self, signum: int) -> int:
        """The child's process group, through its proven members; how many were signalled."""
        ...

    def signal_all(self, signum: int) -> int:
        """Every proven member; how many were signalled."""
        ...

    def signal_pid(self, pid: int, signum: int) -> bool:
        """One process, only when it is proven the run's."""
        ...

    def kill_all(self) -> None:
        """SIGKILL everything of the run, repeated until nothing is left (bounded)."""
        ...

    def empty(self) -> bool:
        """True once nothing of the run is left."""
        ...

    def wait_empty(self, timeout_s: float) -> bool:
        """Block until nothing is left (an event, not a poll where the host has one)."""
        ...

    def cpu_time_s(self) -> float | None:
        """CPU seconds the run's processes used (its cgroup, or its proven tree), None if unknown."""
        ...

    def oom_kills(self) -> int:
        """OOM kills inside the run (cgroup mode with the memory controller), else 0."""
        ...

    def reaped(self, cpu_s: float | None = None) -> None:
        """The root was reaped (``cpu_s``: its CPU time from wait4): its pid proves nothing now."""
        ...

    def close(self) -> None:
        """Nothing is left to watch: close the pidfds, remove the run's cgroup."""
        ...


@dataclass
class ProvenSet:
    """pidfd mode's membership of one run: every process proven by (pid, start time) and by
    descending from a proven member, being the unreaped root's group, or carrying the mark."""

    root_pid: int
    root_start: int
    run_no: int
    home_id: str
    proven: dict[int, Member] = field(default_factory=dict)
    root_reaped: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def discover(self) -> dict[int, Member]:
        """pidfd mode: prove the run's members now; forget the ones that are gone."""
        with self.lock:
            stats = all_stats()
            me = os.getpid()
            for pid, member in list(self.proven.items()):
                found = stats.get(pid)
                if found is not None and found.start_ticks == member.start_ticks:
                    member.pgid = found.pgid
                    if found.state == "Z" and found.ppid == me and pid != self.root_pid:
                        with contextlib.suppress(ChildProcessError):
                            os.waitpid(pid, os.WNOHANG)  # an orphan we adopted, proven ours
                gone = found is None or found.start_ticks != member.start_ticks
                if (gone or found is None or found.state == "Z") and (
                    pid != self.root_pid or self.root_reaped
                ):
                    close_fd(member.pidfd)
                    del self.proven[pid]
            grew = True
            while grew:  # descendants of members found this pass are members too
                grew = False
                for pid, found in stats.items():
                    if pid in self.proven or found.state == "Z":
                        continue
                    if found.start_ticks < self.root_start:
                        continue  # older than the run: never the run's
                    if self.proves(found, stats) and self.take(found):
                        grew = True
            return {
                pid: m
                for pid, m in self.proven.items()
                if not (pid == self.root_pid and self.root_zombie(stats))
            }

    def root_zombie(self, stats: dict[int, ProcStat]) -> bool:
        found = stats.get(self.root_pid)
        return self.root_reaped or found is None or found.state == "Z"

    def proves(self, found: ProcStat, stats: dict[int, ProcStat]) -> bool:
        parent = self.proven.get(found.ppid)
        parent_stat = stats.get(found.ppid)
        if (
            parent is not None
            and parent_stat is not None
            and parent_stat.start_ticks == parent.start_ticks
            and found.start_ticks >= parent.start_ticks
        ):
            return True  # a child of a proven, still-identical member
        if found.pgid == self.root_pid and not self.root_reaped:
            return True  # the root's group while the root's pid is still ours (unreaped)
        return carries_mark(found.pid, self.home_id, self.run_no)

    def take(self, found: ProcStat) -> bool:
        fd = pidfd_open(found.pid)
        if fd is None:
            return False
        again = read_stat(found.pid)  # the pidfd is of the process we proved, or we let go
        if again is None or again.start_ticks != found.start_ticks:
            close_fd(fd)
            return False
        self.proven[found.pid] = Member(found.pid, found.start_ticks, fd, found.pgid)
        return True


@dataclass(slots=True)
class SpawnedChild:
    """A running child: its pid (also its process group and session id), its pipes, its custody."""

    pid: int
    stdout_fd: int
    stderr_fd: int
    process: subprocess.Popen[bytes] | None = None
    custody: RunCustody | None = None
