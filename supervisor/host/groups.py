"""The process seam: what the daemon does to processes, and only to those it started.

:class:`~dflashd.supervisor.host.processops.ProcessOps` (a leaf) is the seam: the daemon launches,
reaps and recovers through it, so the loop tests drive the real daemon logic with a scripted
stand-in and no process is touched.  :class:`HostProcesses` is the real thing.  Every signal to a run goes through that run's
:class:`~dflashd.supervisor.host.proof.RunCustody` (its cgroup, or pidfds of proven members),
never through a bare pid, a process group id, a name or a pattern.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dflashd.supervisor.host.cgroups import CgroupBase, cgroup_pids, own_cgroup
from dflashd.supervisor.host.custody import (
    MODE_CGROUP,
    MODE_PIDFD,
    HostCustody,
    end_stale_cgroup,
    open_base,
)
from dflashd.supervisor.host.procfs import cmdline_text, create_time, read_stat
from dflashd.supervisor.host.proof import MODE_PID, PIDFD_SUPPORTED, SpawnedChild
from dflashd.supervisor.host.recovery import recover
from dflashd.supervisor.host.spawn import spawn
from dflashd.supervisor.model.effects import WriteRecord


class HostProcesses:
    """The real processes of this host, a run per cgroup where the host allows it."""

    def __init__(self, home_id: str) -> None:
        self.home_id = home_id
        self._base: CgroupBase | None = None
        self._base_tried = False
        self._reaped_cpu: dict[int, float] = {}

    @property
    def base(self) -> CgroupBase | None:
        """This home's cgroup base, made on first use (a start refused before that leaves none)."""
        if not self._base_tried:
            self._base_tried = True
            self._base = open_base(self.home_id) if self.home_id else None
        return self._base

    @property
    def mode(self) -> str:
        """``cgroup``, ``pidfd``, or ``pid`` (no pidfds on this kernel)."""
        if self.base is not None:
            return MODE_CGROUP
        return MODE_PIDFD if PIDFD_SUPPORTED else MODE_PID

    def spawn(
        self, argv: tuple[str, ...], *, cwd: Path, env: Mapping[str, str], run_no: int
    ) -> SpawnedChild:
        """See :func:`dflashd.supervisor.host.spawn.spawn`; the child enters ``run-N``'s cgroup."""
        cgroup = self._run_cgroup(run_no)
        launched = spawn(argv, cwd=cwd, env=env, cgroup=cgroup)
        rel = self.base.run_rel(run_no) if self.base is not None else ""
        if cgroup is not None and launched.pid not in cgroup_pids(cgroup):
            # not in its cgroup: the move failed (a host rule), unless the child is already
            # dead (a quick death leaves the cgroup's list; a loaded host shows it)
            after = read_stat(launched.pid)
            if after is not None and after.state != "Z":
                cgroup, rel = None, ""  # alive outside it: this run is kept by pidfds
        found = read_stat(launched.pid)
        start = found.start_ticks if found is not None else 0
        launched.custody = HostCustody(
            launched.pid, run_no, self.home_id, cgroup, start, cgroup_rel=rel
        )
        return launched

    def _run_cgroup(self, run_no: int) -> Path | None:
        if self.base is None:
            return None
        path = self.base.run_dir(run_no)
        if path.exists():
            end_stale_cgroup(path, 5.0)  # a number reused after a lost state: never share it
        try:
            path.mkdir(mode=0o755)
        except OSError:
            return None
        return path

    def wait_nohang(self, pid: int) -> int | None:
        """``wait4(pid, WNOHANG)``; the child's CPU time is kept for :meth:`reaped_cpu_s`."""
        got, status, usage = os.wait4(pid, os.WNOHANG)
        if got != pid:
            return None
        self._reaped_cpu[pid] = usage.ru_utime + usage.ru_stime
        return status

    def reaped_cpu_s(self, pid: int) -> float | None:
        """The CPU time of our child ``pid`` (and of the children it reaped), once reaped."""
        return self._reaped_cpu.pop(pid, None)

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

    def create_time(self, pid: int) -> float | None:
        """``/proc``'s create time, psutil's formula (boot time and start ticks) without its
        import: a launch no longer loads psutil (~14 ms of a start's CPU on the 2-core box)."""
        return create_time(pid)

    def start_ticks(self, pid: int) -> int | None:
        """``/proc/PID/stat``'s start time."""
        found = read_stat(pid)
        return None if found is None else found.start_ticks

    def cmdline(self, pid: int) -> str:
        """The command line, joined and cut at 200 characters ("?" when gone or a zombie)."""
        return cmdline_text(pid) or "?"

    def reap_orphans(self, keep: set[int]) -> None:
        """See :func:`reap_orphans`."""
        reap_orphans(keep)

    def recover(
        self, previous: dict[str, Any], boot: str | None, timeout_s: float
    ) -> list[WriteRecord]:
        """See :func:`dflashd.supervisor.host.recovery.recover`."""

        return recover(previous, self.base, self.home_id, boot, timeout_s)

    def close(self) -> None:
        """Remove this home's cgroup base when nothing is left in it."""
        if self._base is not None:
            self._base.remove()


def in_cgroup(pid: int) -> str | None:
    """The v2 cgroup of ``pid`` (for status and tests)."""
    try:
        return own_cgroup(Path(f"/proc/{pid}/cgroup").read_text())
    except OSError:
        return None


def reap_orphans(keep: set[int]) -> None:
    """As subreaper, orphaned grandchildren are ours: reap the zombies, except the pids in ``keep``."""
    me = os.getpid()
    try:
        names = os.listdir("/proc")
    except OSError:
        return
    for name in names:
        if not name.isdigit() or int(name) in keep:
            continue
        found = read_stat(int(name))
        if found is not None and found.ppid == me and found.state == "Z":
            try:
                os.waitpid(found.pid, os.WNOHANG)
            except ChildProcessError:
                continue
