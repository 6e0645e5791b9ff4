"""The process seam's contract, in a leaf: what the daemon does to processes (:class:`ProcessOps`);
what a launch gives back (:class:`~dflashd.supervisor.host.proof.SpawnedChild`) sits with the custody.

The real implementation is :class:`~dflashd.supervisor.host.groups.HostProcesses`; the loop tests
drive the daemon through a scripted one.  Importing the type pulls in no implementation: the
parts that only hold a ``ProcessOps`` sit low in the house.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from dflashd.supervisor.host.proof import SpawnedChild
from dflashd.supervisor.model.effects import WriteRecord

__all__ = ["ProcessOps", "SpawnedChild"]


class ProcessOps(Protocol):
    """What the daemon does to processes."""

    @property
    def mode(self) -> str:
        """How runs own their processes: ``cgroup``, ``pidfd`` or ``pid`` (status names it)."""
        ...

    def spawn(
        self, argv: tuple[str, ...], *, cwd: Path, env: Mapping[str, str], run_no: int
    ) -> SpawnedChild:
        """Fork and exec in a new session, in the run's custody; OSError when exec fails."""
        ...

    def wait_nohang(self, pid: int) -> int | None:
        """The wait status of our child ``pid`` if it ended, None while it lives.

        Raises ChildProcessError when the status can no longer be known.
        """
        ...

    def reaped_cpu_s(self, pid: int) -> float | None:
        """The CPU time of our reaped child ``pid``, once (None when unknown)."""
        ...

    def live_children(self, pid: int) -> set[int]:
        """The live (non-zombie) children of ``pid``."""
        ...

    def create_time(self, pid: int) -> float | None:
        """When ``pid`` was created (seconds since the epoch), None when it is gone."""
        ...

    def start_ticks(self, pid: int) -> int | None:
        """When ``pid`` started, in clock ticks since boot (no wall clock in it), None when gone."""
        ...

    def cmdline(self, pid: int) -> str:
        """The command line of ``pid``, for naming it in the log."""
        ...

    def reap_orphans(self, keep: set[int]) -> None:
        """Reap zombie children (orphans we inherited as subreaper), except ``keep``."""
        ...

    def recover(
        self, previous: dict[str, Any], boot: str | None, timeout_s: float
    ) -> list[WriteRecord]:
        """End what a dead daemon of this home left, proven ours; the records saying so."""
        ...

    def close(self) -> None:
        """The daemon is done: remove what it made on the host (its cgroups)."""
        ...
