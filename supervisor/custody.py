"""Custody of a run's processes: the one room that sends signals (docs/design.md, "Custody").

A run owns its processes by proof, never by a bare number:

- **cgroup mode**, where the host gives a writable cgroup v2 hierarchy (root, or a systemd
  unit with ``Delegate=yes``): each run is a child cgroup ``dflashd-<home id>/run-N`` under
  the daemon's own.  The child enters it between fork and exec, so everything it ever
  starts (setsid, double forks, respawning chains) is in ``cgroup.procs``; ending the run
  is ``cgroup.kill``; "nothing left" is ``populated 0`` in ``cgroup.events``, waited on
  with ``POLLPRI``; ``cpu.stat`` is the run's CPU time and ``memory.events`` its OOM kills.
- **pidfd mode** everywhere else: a pidfd for the child at fork, and one for every member
  found.  A member is proven by its pid *and* create time, and by either descending from a
  proven live member or carrying the run's mark (``DFLASHD_HOME_ID`` and ``DFLASHD_RUN``) in
  the environment it started with.  Signals go through the pidfds, so a pid reused by a
  stranger can never receive them.  A process group is signalled only through its proven
  members.

No other module calls ``os.kill``, ``os.killpg`` or writes ``cgroup.kill`` (a test greps for
it).  The alert commands' bound (:func:`end_own_child_session`) lives here too.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Protocol

from dflashd.supervisor.cgroups import (
    CgroupBase,
    cgroup_pids,
    own_cgroup,
    read_cgroup_events,
    read_keyed,
    remove_cgroup,
    wait_cgroup_empty,
)
from dflashd.supervisor.procfs import (
    CLK_TCK,
    ProcStat,
    all_stats,
    carries_mark,
    holds_file,
    read_stat,
)

MODE_CGROUP: Final = "cgroup"
MODE_PIDFD: Final = "pidfd"
SWEEP_ROUNDS: Final = 50  # a respawning chain outruns one snapshot, never fifty stopped ones


CGROUP_KILL: Final = "cgroup.kill"  # Linux 5.14: without it, runs are kept by pidfds


def open_base(home_id: str) -> CgroupBase | None:
    """This home's cgroup base, where the host allows it and can end a run at once."""
    return CgroupBase.open(home_id, needs=(CGROUP_KILL,))


def kill_cgroup(path: Path) -> None:
    """Everything in the cgroup, at once (``cgroup.kill``): no fork can escape it."""
    with contextlib.suppress(OSError):
        (path / CGROUP_KILL).write_text("1")


# -- pidfds ---------------------------------------------------------------------------------


NO_PIDFD: Final = -1  # the kernel has no pidfds: identity is proven again before each signal


def _probe_pidfd() -> bool:
    try:
        fd = os.pidfd_open(os.getpid())
    except (OSError, AttributeError):
        return False
    os.close(fd)
    return hasattr(signal, "pidfd_send_signal")


# DFLASHD_CUSTODY=pid forces the no-pidfd path (as on gVisor), =pidfd forces pidfds over a cgroup.
PIDFD_SUPPORTED: Final = os.environ.get("DFLASHD_CUSTODY") != "pid" and _probe_pidfd()
MODE_PID: Final = "pid"  # pidfd mode on a kernel without pidfds (before 5.3, gVisor)


def _pidfd_open(pid: int) -> int | None:
    """A pidfd for ``pid`` (``NO_PIDFD`` where the kernel has none), None when it is gone."""
    if not PIDFD_SUPPORTED:
        return NO_PIDFD
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def _close_fd(fd: int) -> None:
    if fd >= 0:
        with contextlib.suppress(OSError):
            os.close(fd)


def _pidfd_signal(fd: int, signum: int) -> bool:
    try:
        signal.pidfd_send_signal(fd, signum)
    except OSError:
        return False
    return True


def _signal_member(member: Member, signum: int) -> bool:
    """Through its pidfd; without pidfds, by pid right after proving its start time again."""
    if member.pidfd >= 0:
        return _pidfd_signal(member.pidfd, signum)
    found = read_stat(member.pid)
    if found is None or found.start_ticks != member.start_ticks:
        return False
    try:
        os.kill(member.pid, signum)
    except OSError:
        return False
    return True


def _poll_exits(members: Iterable[Member], timeout_s: float) -> None:
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


# -- one run's custody ----------------------------------------------------------------------


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
class HostCustody:
    """The real custody of one run (cgroup mode when ``cgroup`` is set, pidfd mode otherwise)."""

    root_pid: int
    run_no: int
    home_id: str
    cgroup: Path | None
    root_start: int
    cgroup_rel: str = ""
    mode: str = MODE_PIDFD
    proven: dict[int, Member] = field(default_factory=dict)
    root_reaped: bool = False
    reaped_cpu_s: float | None = None  # the child's CPU time from wait4, once reaped
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.cgroup is not None:
            self.mode = MODE_CGROUP
        else:
            self.mode = MODE_PIDFD if PIDFD_SUPPORTED else MODE_PID
        fd = _pidfd_open(self.root_pid)
        if fd is not None:
            self.proven[self.root_pid] = Member(self.root_pid, self.root_start, fd, self.root_pid)

    # -- membership --

    def members(self) -> set[int]:
        if self.cgroup is not None:
            return cgroup_pids(self.cgroup)
        return set(self._discover())

    def owns(self, pid: int) -> bool:
        if self.cgroup is not None:
            return pid in cgroup_pids(self.cgroup) or self._in_cgroup(pid)
        with self._lock:
            member = self.proven.get(pid)
            if member is not None:
                return member.alive()
        return pid in self._discover()

    def _in_cgroup(self, pid: int) -> bool:
        assert self.cgroup is not None
        try:
            text = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            return False
        here = own_cgroup(text)
        rel = self.cgroup_rel
        return bool(rel) and here is not None and (here == rel or here.startswith(rel + "/"))

    def _discover(self) -> dict[int, Member]:
        """pidfd mode: prove the run's members now; forget the ones that are gone."""
        with self._lock:
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
                    _close_fd(member.pidfd)
                    del self.proven[pid]
            grew = True
            while grew:  # descendants of members found this pass are members too
                grew = False
                for pid, found in stats.items():
                    if pid in self.proven or found.state == "Z":
                        continue
                    if found.start_ticks < self.root_start:
                        continue  # older than the run: never the run's
                    if self._proves(found, stats) and self._take(found):
                        grew = True
            return {
                pid: m
                for pid, m in self.proven.items()
                if not (pid == self.root_pid and self._root_zombie(stats))
            }

    def _root_zombie(self, stats: dict[int, ProcStat]) -> bool:
        found = stats.get(self.root_pid)
        return self.root_reaped or found is None or found.state == "Z"

    def _proves(self, found: ProcStat, stats: dict[int, ProcStat]) -> bool:
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

    def _take(self, found: ProcStat) -> bool:
        fd = _pidfd_open(found.pid)
        if fd is None:
            return False
        again = read_stat(found.pid)  # the pidfd is of the process we proved, or we let go
        if again is None or again.start_ticks != found.start_ticks:
            _close_fd(fd)
            return False
        self.proven[found.pid] = Member(found.pid, found.start_ticks, fd, found.pgid)
        return True

    # -- signals --

    def signal_root(self, signum: int) -> bool:
        member = self.proven.get(self.root_pid)
        if member is None or self.root_reaped:
            return False
        return _signal_member(member, signum)

    def signal_group(self, signum: int) -> int:
        found = self._discover() if self.cgroup is None else self._cgroup_members()
        return self._send([m for m in found.values() if m.pgid == self.root_pid], signum)

    def signal_all(self, signum: int) -> int:
        found = self._discover() if self.cgroup is None else self._cgroup_members()
        return self._send(found.values(), signum)

    def signal_pid(self, pid: int, signum: int) -> bool:
        found = self._discover() if self.cgroup is None else self._cgroup_members()
        member = found.get(pid)
        return member is not None and _signal_member(member, signum)

    def _cgroup_members(self) -> dict[int, Member]:
        """cgroup mode: pidfds for what ``cgroup.procs`` lists (proof by construction)."""
        assert self.cgroup is not None
        with self._lock:
            for pid, member in list(self.proven.items()):
                if pid != self.root_pid and not member.alive():
                    _close_fd(member.pidfd)
                    del self.proven[pid]
            for pid in cgroup_pids(self.cgroup) - set(self.proven):
                found = read_stat(pid)
                if found is not None:
                    self._take(found)
            listed = cgroup_pids(self.cgroup)
            return {pid: m for pid, m in self.proven.items() if pid in listed}

    @staticmethod
    def _send(members: Iterable[Member], signum: int) -> int:
        return sum(1 for m in members if _signal_member(m, signum))

    def kill_all(self) -> None:
        if self.cgroup is not None:
            kill_cgroup(self.cgroup)
            return
        for _ in range(SWEEP_ROUNDS):  # stop first, so a respawning chain cannot fork ahead
            found = self._discover()
            if not found:
                return
            self._send(found.values(), signal.SIGSTOP)
            self._send(self._discover().values(), signal.SIGKILL)

    def empty(self) -> bool:
        if self.cgroup is not None:
            events = read_cgroup_events(self.cgroup)
            return events.get("populated", 0) == 0
        return not self._discover()

    def wait_empty(self, timeout_s: float) -> bool:
        if self.cgroup is not None:
            return wait_cgroup_empty(self.cgroup, timeout_s)
        deadline = time.monotonic() + timeout_s
        while True:
            found = self._discover()
            if not found:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            _poll_exits(found.values(), min(left, 0.2))  # a pidfd turns readable at its exit

    def cpu_time_s(self) -> float | None:
        if self.cgroup is not None:
            usec = read_keyed(self.cgroup / "cpu.stat").get("usage_usec")
            return None if usec is None else usec / 1e6
        if self.root_reaped:
            return self.reaped_cpu_s
        ticks = 0  # the proven tree: each member's own time and its reaped children's
        for pid in self._discover():
            found = read_stat(pid)
            ticks += found.cpu_ticks if found is not None else 0
        return ticks / CLK_TCK

    def oom_kills(self) -> int:
        if self.cgroup is None:
            return 0
        return read_keyed(self.cgroup / "memory.events").get("oom_kill", 0)

    def reaped(self, cpu_s: float | None = None) -> None:
        self.root_reaped = True
        self.reaped_cpu_s = cpu_s

    def close(self) -> None:
        with self._lock:
            for member in self.proven.values():
                with contextlib.suppress(OSError):
                    _close_fd(member.pidfd)
            self.proven.clear()
        if self.cgroup is not None and self.empty():
            remove_cgroup(self.cgroup)


def die_with_parent(parent_pid: int, death_signal: int) -> None:
    """Pre-exec: the parent died before ``PR_SET_PDEATHSIG`` took effect: die now."""
    if os.getppid() != parent_pid:
        signal.raise_signal(death_signal)


# -- previous daemons, alert commands and the subreaper's own ---------------------------------


def end_stale_cgroup(path: Path, timeout_s: float) -> set[int]:
    """A dead daemon's run cgroup: kill what is in it, wait, remove it; the pids that were there."""
    pids = cgroup_pids(path)
    if pids:
        kill_cgroup(path)
        wait_cgroup_empty(path, timeout_s)
    remove_cgroup(path)
    return pids


def end_proven(pids: dict[int, int], timeout_s: float) -> None:
    """SIGTERM processes proven by (pid, start ticks), SIGKILL the ones left after ``timeout_s``."""
    members: list[Member] = []
    for pid, start in pids.items():
        fd = _pidfd_open(pid)
        found = read_stat(pid)
        if fd is None:
            continue
        if found is None or found.start_ticks != start:
            _close_fd(fd)
            continue
        members.append(Member(pid, start, fd, found.pgid))
    try:
        HostCustody._send(members, signal.SIGTERM)
        HostCustody._send(members, signal.SIGCONT)
        deadline = time.monotonic() + timeout_s
        while any(m.alive() for m in members) and time.monotonic() < deadline:
            _poll_exits(members, 0.1)
        HostCustody._send([m for m in members if m.alive()], signal.SIGKILL)
    finally:
        for member in members:
            _close_fd(member.pidfd)


def end_own_child_session(process: subprocess.Popen[bytes]) -> None:
    """An alert command past its bound: SIGKILL its session (our unreaped child: the id is ours)."""
    if process.returncode is not None:
        return
    with contextlib.suppress(OSError):
        os.killpg(process.pid, signal.SIGKILL)


def end_adopted(exclude: set[int]) -> None:
    """At exit (pidfd mode's last net): our own children that no run proved, and theirs.

    A direct child of the daemon is ours by construction (an unreaped child's pid cannot
    be reused): an orphan we adopted as subreaper, or a run's root.  Alert commands
    (``exclude``) and their sessions are left to their own bound.  Stopped first, then
    killed, round after round, so a respawning chain cannot outrun the sweep.
    """
    me = os.getpid()
    for _ in range(SWEEP_ROUNDS):
        stats = all_stats()
        spared = {pid for pid, st in stats.items() if pid in exclude or st.pgid in exclude}
        tree: dict[int, Member] = {}
        for pid, found in stats.items():
            if found.ppid == me and found.state != "Z" and pid not in spared:
                fd = _pidfd_open(pid)
                if fd is not None:
                    tree[pid] = Member(pid, found.start_ticks, fd, found.pgid)
        grew = True
        while grew:
            grew = False
            for pid, found in stats.items():
                parent = tree.get(found.ppid)
                if pid in tree or found.state == "Z" or pid in spared or parent is None:
                    continue
                if found.start_ticks < parent.start_ticks:
                    continue
                fd = _pidfd_open(pid)
                if fd is None:
                    continue
                again = read_stat(pid)
                if again is None or again.start_ticks != found.start_ticks:
                    _close_fd(fd)
                    continue
                tree[pid] = Member(pid, found.start_ticks, fd, found.pgid)
                grew = True
        try:
            if not tree:
                return
            HostCustody._send(tree.values(), signal.SIGSTOP)
            HostCustody._send(tree.values(), signal.SIGKILL)
        finally:
            for member in tree.values():
                _close_fd(member.pidfd)
        for pid, found in all_stats().items():
            if found.ppid == me and found.state == "Z" and pid not in exclude:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)


def signal_lock_holder(pid: int, lock: Path, signum: int) -> bool:
    """Signal the daemon holding ``lock``, proven by the lock file among its descriptors.

    The pidfd is taken first and the proof checked after, so the signal reaches the very
    process that was proven, never one that took its pid in between.
    """
    fd = _pidfd_open(pid)
    found = read_stat(pid)
    if fd is None or found is None:
        return False
    try:
        member = Member(pid, found.start_ticks, fd, found.pgid)
        return holds_file(pid, lock) and _signal_member(member, signum)
    finally:
        _close_fd(fd)
