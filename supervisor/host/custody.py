"""Custody of a run's processes: the one module that sends signals (docs/design.md, "Custody").

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
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from dflashd.supervisor.host.cgroups import (
    CgroupBase,
    cgroup_pids,
    own_cgroup,
    read_cgroup_events,
    read_keyed,
    remove_cgroup,
    wait_cgroup_empty,
)
from dflashd.supervisor.host.closure import adopted_members, our_live_children, stop_closure
from dflashd.supervisor.host.procfs import (
    CLK_TCK,
    all_stats,
    cmdline_text,
    holds_file,
    read_stat,
)
from dflashd.supervisor.host.proof import (
    MODE_PID,
    PIDFD_SUPPORTED,
    Member,
    ProvenSet,
    close_fd,
    pidfd_open,
    poll_exits,
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


# -- one run's custody ----------------------------------------------------------------------


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
    reaped_cpu_s: float | None = None  # the child's CPU time from wait4, once reaped
    proof: ProvenSet = field(init=False)

    def __post_init__(self) -> None:
        self.proof = ProvenSet(self.root_pid, self.root_start, self.run_no, self.home_id)
        if self.cgroup is not None:
            self.mode = MODE_CGROUP
        else:
            self.mode = MODE_PIDFD if PIDFD_SUPPORTED else MODE_PID
        fd = pidfd_open(self.root_pid)
        if fd is not None:
            self.proof.proven[self.root_pid] = Member(
                self.root_pid, self.root_start, fd, self.root_pid
            )

    # -- membership --

    def members(self) -> set[int]:
        if self.cgroup is not None:
            return cgroup_pids(self.cgroup)
        return set(self.proof.discover())

    def owns(self, pid: int) -> bool:
        if self.cgroup is not None:
            return pid in cgroup_pids(self.cgroup) or self._in_cgroup(pid)
        with self.proof.lock:
            member = self.proof.proven.get(pid)
            if member is not None:
                return member.alive()
        return pid in self.proof.discover()

    def _in_cgroup(self, pid: int) -> bool:
        assert self.cgroup is not None
        try:
            text = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            return False
        here = own_cgroup(text)
        rel = self.cgroup_rel
        return bool(rel) and here is not None and (here == rel or here.startswith(rel + "/"))

    # -- signals --

    def signal_root(self, signum: int) -> bool:
        member = self.proof.proven.get(self.root_pid)
        if member is None or self.proof.root_reaped:
            return False
        return _signal_member(member, signum)

    def signal_group(self, signum: int) -> int:
        found = self.proof.discover() if self.cgroup is None else self._cgroup_members()
        return self._send([m for m in found.values() if m.pgid == self.root_pid], signum)

    def signal_all(self, signum: int) -> int:
        found = self.proof.discover() if self.cgroup is None else self._cgroup_members()
        return self._send(found.values(), signum)

    def signal_pid(self, pid: int, signum: int) -> bool:
        found = self.proof.discover() if self.cgroup is None else self._cgroup_members()
        member = found.get(pid)
        return member is not None and _signal_member(member, signum)

    def _cgroup_members(self) -> dict[int, Member]:
        """cgroup mode: pidfds for what ``cgroup.procs`` lists (proof by construction)."""
        assert self.cgroup is not None
        with self.proof.lock:
            for pid, member in list(self.proof.proven.items()):
                if pid != self.root_pid and not member.alive():
                    close_fd(member.pidfd)
                    del self.proof.proven[pid]
            for pid in cgroup_pids(self.cgroup) - set(self.proof.proven):
                found = read_stat(pid)
                if found is not None:
                    self.proof.take(found)
            listed = cgroup_pids(self.cgroup)
            return {pid: m for pid, m in self.proof.proven.items() if pid in listed}

    @staticmethod
    def _send(members: Iterable[Member], signum: int) -> int:
        return sum(1 for m in members if _signal_member(m, signum))

    def kill_all(self) -> None:
        if self.cgroup is not None:
            kill_cgroup(self.cgroup)
            return
        for _ in range(SWEEP_ROUNDS):  # stop first, so a respawning chain cannot fork ahead
            found = self._found_or_confirmed_gone()
            if not found:
                return
            stopped = stop_closure(found, self.proof.proves, _stop)
            self._send(stopped.values(), signal.SIGKILL)
            for pid, member in stopped.items():
                if pid not in found:  # opened by the closure; the set's own it closes itself
                    close_fd(member.pidfd)

    def empty(self) -> bool:
        if self.cgroup is not None:
            events = read_cgroup_events(self.cgroup)
            return events.get("populated", 0) == 0
        return not self._found_or_confirmed_gone()

    def wait_empty(self, timeout_s: float) -> bool:
        if self.cgroup is not None:
            return wait_cgroup_empty(self.cgroup, timeout_s)
        deadline = time.monotonic() + timeout_s
        while True:
            found = self._found_or_confirmed_gone()
            if not found:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            poll_exits(found.values(), min(left, 0.2))  # a pidfd turns readable at its exit

    def _found_or_confirmed_gone(self) -> dict[int, Member]:
        """The run's members, or {} only when confirmed: one scan of /proc is not atomic, and a
        chain whose link forks and exits while it reads can fall between its pids.  Empty
        means the scan, then our adopted children (a link whose parent exited is ours at
        once, as subreaper: one atomic read, returned as they are), then a second scan all
        found nothing."""
        found = self.proof.discover()
        if found:
            return found
        return adopted_members(self.proof) or self.proof.discover()

    def cpu_time_s(self) -> float | None:
        if self.cgroup is not None:
            usec = read_keyed(self.cgroup / "cpu.stat").get("usage_usec")
            return None if usec is None else usec / 1e6
        if self.proof.root_reaped:
            return self.reaped_cpu_s
        ticks = 0  # the proven tree: each member's own time and its reaped children's
        for pid in self.proof.discover():
            found = read_stat(pid)
            ticks += found.cpu_ticks if found is not None else 0
        return ticks / CLK_TCK

    def oom_kills(self) -> int:
        if self.cgroup is None:
            return 0
        return read_keyed(self.cgroup / "memory.events").get("oom_kill", 0)

    def reaped(self, cpu_s: float | None = None) -> None:
        self.proof.root_reaped = True
        self.reaped_cpu_s = cpu_s

    def close(self) -> None:
        with self.proof.lock:
            for member in self.proof.proven.values():
                with contextlib.suppress(OSError):
                    close_fd(member.pidfd)
            self.proof.proven.clear()
        if self.cgroup is not None and self.empty():
            remove_cgroup(self.cgroup)


def _stop(members: Iterable[Member]) -> None:
    """SIGSTOP for :func:`closure.stop_closure` (the signal is sent here, the one module)."""
    HostCustody._send(members, signal.SIGSTOP)


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
        fd = pidfd_open(pid)
        found = read_stat(pid)
        if fd is None:
            continue
        if found is None or found.start_ticks != start:
            close_fd(fd)
            continue
        members.append(Member(pid, start, fd, found.pgid))
    try:
        HostCustody._send(members, signal.SIGTERM)
        HostCustody._send(members, signal.SIGCONT)
        deadline = time.monotonic() + timeout_s
        while any(m.alive() for m in members) and time.monotonic() < deadline:
            poll_exits(members, 0.1)
        HostCustody._send([m for m in members if m.alive()], signal.SIGKILL)
    finally:
        for member in members:
            close_fd(member.pidfd)


def end_own_child_session(process: subprocess.Popen[bytes]) -> None:
    """An alert command past its bound: SIGKILL its session (our unreaped child: the id is ours)."""
    if process.returncode is not None:
        return
    with contextlib.suppress(OSError):
        os.killpg(process.pid, signal.SIGKILL)


def end_adopted(exclude: set[int]) -> dict[str, str]:
    """At exit (pidfd mode's last net): our own children that no run proved, and theirs.

    A direct child of the daemon is ours by construction (an unreaped child's pid cannot
    be reused): an orphan we adopted as subreaper, or a run's root.  Alert commands
    (``exclude``) and their sessions are left to their own bound.  Stopped first, then
    killed, round after round, so a respawning chain cannot outrun the sweep.  Returns every
    process it ended (pid: command line), for the record that names them.
    """
    me = os.getpid()
    ended: dict[str, str] = {}
    for _ in range(SWEEP_ROUNDS):
        stats = all_stats()
        spared = {pid for pid, st in stats.items() if pid in exclude or st.pgid in exclude}
        tree: dict[int, Member] = {}
        for found in our_live_children(stats, exclude):
            fd = pidfd_open(found.pid)
            if fd is not None:
                tree[found.pid] = Member(found.pid, found.start_ticks, fd, found.pgid)
        grew = True
        while grew:
            grew = False
            for pid, found in stats.items():
                parent = tree.get(found.ppid)
                if pid in tree or found.state == "Z" or pid in spared or parent is None:
                    continue
                if found.start_ticks < parent.start_ticks:
                    continue
                fd = pidfd_open(pid)
                if fd is None:
                    continue
                again = read_stat(pid)
                if again is None or again.start_ticks != found.start_ticks:
                    close_fd(fd)
                    continue
                tree[pid] = Member(pid, found.start_ticks, fd, found.pgid)
                grew = True
        if not tree:
            return ended
        stopped = tree
        try:  # stopped with all they fork meanwhile, named while stopped, then killed
            stopped = stop_closure(tree, lambda st, _: not {st.pid, st.pgid} & exclude, _stop)
            ended.update((str(pid), cmdline_text(pid)) for pid in stopped)
            HostCustody._send(stopped.values(), signal.SIGKILL)
        finally:
            for member in {**tree, **stopped}.values():
                close_fd(member.pidfd)
        for pid, found in all_stats().items():
            if found.ppid == me and found.state == "Z" and pid not in exclude:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
    return ended


def signal_lock_holder(pid: int, lock: Path, signum: int) -> bool:
    """Signal the daemon holding ``lock``, proven by the lock file among its descriptors.

    The pidfd is taken first and the proof checked after, so the signal reaches the very
    process that was proven, never one that took its pid in between.
    """
    fd = pidfd_open(pid)
    found = read_stat(pid)
    if fd is None or found is None:
        return False
    try:
        member = Member(pid, found.start_ticks, fd, found.pgid)
        return holds_file(pid, lock) and _signal_member(member, signum)
    finally:
        close_fd(fd)
