"""cgroup v2, where the host allows it: finding the hierarchy, this home's base, a run's cgroup.

Reading and creating only: ending a run (``cgroup.kill``) is :mod:`custody`'s, the one module
that signals.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

MOUNTINFO: Final = Path("/proc/self/mountinfo")
SELF_CGROUP: Final = Path("/proc/self/cgroup")


def cgroup2_mount(mountinfo: str) -> Path | None:
    """The cgroup2 mount point from ``/proc/self/mountinfo`` text (hybrid hosts: ``…/unified``)."""
    for line in mountinfo.splitlines():
        head, sep, tail = line.partition(" - ")
        if not sep:
            continue
        fields, fstype = head.split(), tail.split()
        if len(fields) >= 5 and fstype and fstype[0] == "cgroup2":
            return Path(fields[4].replace("\\040", " "))
    return None


def own_cgroup(proc_self_cgroup: str) -> str | None:
    """The v2 path in ``/proc/self/cgroup`` text (the ``0::`` line)."""
    for line in proc_self_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return None


def read_cgroup_events(directory: Path) -> dict[str, int]:
    """``cgroup.events`` (``populated``, ``frozen``) or the ``*.events`` file named."""
    return read_keyed(directory / "cgroup.events")


def read_keyed(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        with contextlib.suppress(ValueError):
            out[key] = int(value)
    return out


class CgroupBase:
    """This home's cgroup, ``<daemon's cgroup>/dflashd-<home id>``: the parent of every run's."""

    def __init__(self, path: Path, rel: str) -> None:
        self.path = path
        self.rel = rel  # as /proc/PID/cgroup names it

    @classmethod
    def open(cls, home_id: str, needs: tuple[str, ...] = ()) -> CgroupBase | None:
        """Make (or reuse) the base under the daemon's cgroup; None where the host does not allow
        it, or where a run cgroup lacks one of the files in ``needs``."""
        if os.environ.get("DFLASHD_CUSTODY") in ("pidfd", "pid"):
            return None
        try:
            mount = cgroup2_mount(MOUNTINFO.read_text())
            own = own_cgroup(SELF_CGROUP.read_text())
        except OSError:
            return None
        if mount is None or own is None:
            return None
        parent = mount / own.lstrip("/")
        path = parent / f"dflashd-{home_id[:16]}"
        try:
            path.mkdir(mode=0o755, exist_ok=True)
            probe = path / ".probe"
            probe.mkdir(exist_ok=True)
            ok = all((probe / name).exists() for name in ("cgroup.procs", *needs))
            probe.rmdir()
        except OSError:
            return None
        if not ok or not os.access(path / "cgroup.procs", os.W_OK):
            return None
        base = cls(path, "/".join(("", *own.strip("/").split("/"), path.name)).replace("//", "/"))
        delegated_unit = bool(os.environ.get("INVOCATION_ID"))  # systemd runs us as a service
        if own != "/" and delegated_unit and cgroup_pids(parent) == {os.getpid()}:
            base._leave_for_leaf(parent)  # Delegate=yes and we are alone in the unit's cgroup
        base._enable_controllers(parent)
        return base

    def _leave_for_leaf(self, parent: Path) -> None:
        """Move the daemon into ``<own>/supervisor``: with no process left in its own cgroup,
        controllers (memory: OOM kills) can be enabled for the runs beside it."""
        leaf = parent / "supervisor"
        try:
            leaf.mkdir(mode=0o755, exist_ok=True)
            (leaf / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:
            return

    def _enable_controllers(self, parent: Path) -> None:
        """The memory controller (for OOM kills) where the parent offers it; fine when refused.

        Not the cpu controller: ``cpu.stat``'s usage (the run's CPU time) is there without it,
        and with it a run is one scheduling entity of one task's weight beside the processes of
        the daemon's cgroup (a root cgroup: every process of a host without systemd), so a job
        of many threads got one thread's share beside them, and each of its context switches
        went through the group's accounting (issue 53)."""
        for where in (parent, self.path):
            try:
                offered = (where / "cgroup.controllers").read_text().split()
            except OSError:
                return
            if "memory" in offered:
                with contextlib.suppress(OSError):
                    (where / "cgroup.subtree_control").write_text("+memory")

    def run_dir(self, run_no: int) -> Path:
        """Where run ``run_no`` lives."""
        return self.path / f"run-{run_no}"

    def run_rel(self, run_no: int) -> str:
        """Run ``run_no``'s cgroup as ``/proc/PID/cgroup`` names it."""
        return f"{self.rel}/run-{run_no}"

    def stale_runs(self) -> list[tuple[int, Path]]:
        """Run cgroups a previous daemon left (a SIGKILLed daemon cannot clean up)."""
        out: list[tuple[int, Path]] = []
        with contextlib.suppress(OSError):
            for entry in self.path.iterdir():
                number = entry.name.removeprefix("run-")
                if entry.is_dir() and entry.name.startswith("run-") and number.isdigit():
                    out.append((int(number), entry))
        return sorted(out)

    def remove(self) -> None:
        """At exit: the base goes when nothing is left in it."""
        for _, path in self.stale_runs():
            remove_cgroup(path)
        with contextlib.suppress(OSError):
            self.path.rmdir()


def remove_cgroup(path: Path) -> bool:
    try:
        path.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def cgroup_pids(path: Path) -> set[int]:
    """The processes in one cgroup (``cgroup.procs``), zombies already gone."""
    try:
        return {int(x) for x in (path / "cgroup.procs").read_text().split()}
    except (OSError, ValueError):
        return set()


def wait_cgroup_empty(path: Path, timeout_s: float) -> bool:
    """Block until ``populated 0`` (``cgroup.events`` wakes ``POLLPRI``), at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    try:
        fd = os.open(path / "cgroup.events", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return True  # the cgroup is gone
    try:
        poller = select.poll()
        poller.register(fd, select.POLLPRI | select.POLLERR)
        while True:
            os.lseek(fd, 0, os.SEEK_SET)
            text = os.read(fd, 4096).decode(errors="replace")
            if "populated 0" in text:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            poller.poll(left * 1000)
    except OSError:
        return not cgroup_pids(path)
    finally:
        os.close(fd)


def open_procs_fd(cgroup: Path | None) -> int | None:
    """The run cgroup's ``cgroup.procs``, opened by the parent for the child's pre-exec write."""
    if cgroup is None:
        return None
    try:
        return os.open(cgroup / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.EACCES, errno.EPERM):
            return None
        raise


def enter_cgroup_fd(procs_fd: int | None) -> Callable[[], None]:
    """The pre-exec step that moves the child into its run's cgroup (writes ``0``: itself)."""

    def enter() -> None:
        if procs_fd is not None:
            with contextlib.suppress(OSError):
                os.write(procs_fd, b"0")

    return enter
