"""Before a relaunch: the dead run's GPU memory released, or waited for (pure).

The GPU watch reads a sample taken after the death and names who holds memory
(:class:`GpuHolders`): the dead run's own processes (seen as its own, or proven now) and
strangers.  :func:`release_step` decides, from the wait so far (:class:`ReleaseWait`): a
stranger is recorded once per run and never touched; the run's own holders are recorded and
ended when first seen, then waited for, looked at every ``RELEASE_POLL_S`` (with a fresh
sample), until they let go (``gpu_memory_released``, how long it took) or the config's timeout
passes (``gpu_release_timeout``: the relaunch goes ahead).  A sample from before the death
proves nothing: without one taken since (``fresh`` false) the look comes again in
``FRESH_SAMPLE_WAIT_S``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from dflashd.supervisor.model.deadlines import Deadline
from dflashd.supervisor.model.effects import Effect, KillHolders, SetTimer, WriteRecord
from dflashd.supervisor.model.events import Event

# A sample is asked for at the death and looked for every FRESH_SAMPLE_WAIT_S; while the dead
# run's memory is still held, another every RELEASE_POLL_S (a wait of up to gpu_poll_s was
# 2.1 s of a restart; an NVML read takes ~0.05 ms).
FRESH_SAMPLE_WAIT_S: Final = 0.01
RELEASE_POLL_S: Final = 0.25


@dataclass(frozen=True, slots=True)
class GpuHolders:
    """Who holds GPU memory in a sample taken since the death (``fresh``; else none yet):
    the dead run's processes and strangers (``gpu``, ``pid``, ``mib``, ``cmd`` each)."""

    fresh: bool
    ours: tuple[Mapping[str, Any], ...] = ()
    foreign: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class ReleaseWait:
    """The wait so far: since when the dead run's memory was seen held (None: not held), and
    whether this run's strangers were recorded already."""

    since: float | None = None
    foreign_said: bool = False


def release_step(
    wait: ReleaseWait, holders: GpuHolders | None, now: float, timeout_s: float, poll_s: float
) -> tuple[ReleaseWait, tuple[Effect, ...], bool]:
    """The next wait, its records and actions, and whether the relaunch may go ahead
    (``holders`` None: the GPU checks are off, nothing to wait for); the config's
    ``gpu_release_timeout_s`` and ``gpu_poll_s`` (the daemon's ``Rules``)."""
    if holders is None:
        return replace(wait, since=None), (), True
    if not holders.fresh:
        return wait, (SetTimer(Deadline.RELEASE_CHECK, now + FRESH_SAMPLE_WAIT_S),), False
    said: list[Effect] = []
    if holders.foreign and not wait.foreign_said:
        said.append(WriteRecord(Event.GPU_FOREIGN_HOLDER, {"holders": list(holders.foreign)}))
        wait = replace(wait, foreign_said=True)
    ours = list(holders.ours)
    if not ours:
        if wait.since is not None:
            waited = round(now - wait.since, 3)
            said.append(WriteRecord(Event.GPU_MEMORY_RELEASED, {"waited_s": waited}))
        return replace(wait, since=None), tuple(said), True
    kill: tuple[Effect, ...] = ()
    since = wait.since
    if since is None:  # first seen held: named, and ended where proven ours
        since = now
        said.append(WriteRecord(Event.GPU_MEMORY_HELD, {"holders": ours}))
        kill = (KillHolders(tuple(int(entry["pid"]) for entry in ours)),)
    waited = now - since
    if waited >= timeout_s:
        fields = {"holders": ours, "waited_s": round(waited, 3)}
        said.append(WriteRecord(Event.GPU_RELEASE_TIMEOUT, fields))
        return replace(wait, since=None), (*said, *kill), True
    again = SetTimer(Deadline.RELEASE_CHECK, now + min(poll_s, RELEASE_POLL_S))
    return replace(wait, since=since), (*said, *kill, again), False
