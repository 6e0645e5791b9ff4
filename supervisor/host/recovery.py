"""Start-up after a daemon died without cleaning up: what it left, proven ours before anything is touched.

state.json names the child the previous daemon ran: its pid, create time, run number and
the boot it ran in.  A pid alone proves nothing (after a reboot or a pid wrap it belongs to
someone else), so a process is ours only if all of these hold:

- the same boot (``/proc/sys/kernel/random/boot_id``);
- born no earlier than the recorded child (the child itself: the same create time);
- it carries the mark only our child's processes carry: this home's id (``DFLASHD_HOME_ID``,
  stored in the home, so a symlinked path to the same home still matches) and
  ``DFLASHD_RUN`` of that run in ``/proc/PID/environ``.

Without proof nothing is killed; the record says why.  With proof, the proven processes are
ended through pidfds taken on (pid, start time), never by a group id that may have been
reused.  In cgroup mode a dead daemon's run cgroups are this home's by construction: what is
in them is killed with ``cgroup.kill`` and the cgroups removed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from dflashd.supervisor.host.cgroups import CgroupBase
from dflashd.supervisor.host.custody import end_proven, end_stale_cgroup
from dflashd.supervisor.host.procfs import all_stats, carries_mark, create_time, process_mark
from dflashd.supervisor.model.effects import WriteRecord
from dflashd.supervisor.model.ending import lost_facts
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.lifecycle import State
from dflashd.supervisor.model.runstate import RunFacts

BOOT_ID_PATH: Final = Path("/proc/sys/kernel/random/boot_id")
_SAME_CREATE_TIME_S: Final = 0.05  # create times are in clock ticks (1/100 s)


def boot_id() -> str | None:
    """This boot's id, or None where the kernel does not say."""
    try:
        return BOOT_ID_PATH.read_text().strip() or None
    except OSError:
        return None


@dataclass(frozen=True, slots=True)
class PreviousChild:
    """What state.json recorded of the previous daemon's child (validated)."""

    pid: int
    run_no: int
    create_time: float | None
    boot_id: str | None
    start_ticks: int | None = None  # since boot: compared exactly (a clock step moves create_time)


@dataclass
class LeftoverSearch:
    """The verdict on one recorded child: which pids are proven ours, and what was refused."""

    proven: dict[int, int] = field(default_factory=dict)  # pid -> start ticks (its identity)
    refused: dict[int, str] = field(default_factory=dict)
    note: str = ""


def find_leftovers(child: PreviousChild, home_id: str, current_boot: str | None) -> LeftoverSearch:
    """Which processes of the previous run still live, proven ours (reads /proc only)."""
    out = LeftoverSearch()
    stats = all_stats()
    candidates = {
        pid
        for pid, found in stats.items()
        if found.state != "Z"
        and (child.pid in (pid, found.pgid) or carries_mark(pid, home_id, child.run_no))
    }
    candidates.discard(os.getpid())
    if not candidates:
        return out  # nothing left: the usual case (the child died with its daemon)
    if child.boot_id is None or current_boot is None:
        out.note = "no boot id recorded: cannot prove the processes are ours"
        return out
    if child.boot_id != current_boot:
        out.note = "the host rebooted since: the recorded pid is not ours"
        return out
    for pid in sorted(candidates):
        why = _not_after_the_child(pid, stats[pid].start_ticks, child)
        if why is _GONE:
            continue
        if why is not None:
            out.refused[pid] = why
            continue
        if not carries_mark(pid, home_id, child.run_no):
            mark = process_mark(pid)
            why = "does not carry this home's DFLASHD_HOME_ID/DFLASHD_RUN"
            out.refused[pid] = why if not mark else f"{why} (another home's or run's mark)"
            continue
        out.proven[pid] = stats[pid].start_ticks
    return out


_GONE: Final = "gone"  # ended between the scan and the look: neither proven nor refused


def _not_after_the_child(pid: int, ticks: int, child: PreviousChild) -> str | None:
    """Why ``pid`` cannot be the recorded child or one it started (``_GONE``: it just ended),
    or None.  By start ticks since boot where state.json has them: the wall clock's boot time
    (``/proc/stat``'s btime, in every create time) moves when the clock is stepped, and a
    step of more than a tick between two daemons made the child itself "another process"."""
    if child.start_ticks is not None:
        if pid == child.pid and ticks != child.start_ticks:
            return "same pid, another process (start time differs)"
        return "older than the recorded child" if ticks < child.start_ticks else None
    born = create_time(pid)  # a state.json written before start ticks were recorded
    if born is None:
        return _GONE
    if child.create_time is None:
        return "no create time recorded"
    if pid == child.pid and abs(born - child.create_time) > _SAME_CREATE_TIME_S:
        return "same pid, another process (create time differs)"
    if born + _SAME_CREATE_TIME_S < child.create_time:
        return "older than the recorded child"
    return None


def previous_child(state: dict[str, object]) -> PreviousChild | None:
    """The child recorded in a state.json object, if it is well-formed."""
    child = state.get("child")
    if not isinstance(child, dict):
        return None
    pid = child.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1 or pid == os.getpid():
        return None
    run_no = state.get("run")
    if not isinstance(run_no, int) or isinstance(run_no, bool):
        return None
    created = child.get("create_time")
    boot = child.get("boot_id")
    ticks = child.get("start_ticks")
    return PreviousChild(
        pid,
        run_no,
        float(created)
        if isinstance(created, int | float) and not isinstance(created, bool)
        else None,
        boot if isinstance(boot, str) else None,
        ticks if isinstance(ticks, int) and not isinstance(ticks, bool) and ticks >= 0 else None,
    )


def recover(
    previous: dict[str, Any],
    base: CgroupBase | None,
    home_id: str,
    current_boot: str | None,
    stop_timeout_s: float,
) -> list[WriteRecord]:
    """End what the previous daemon left, once proven ours; the records saying so."""
    records: list[WriteRecord] = []
    for run_no, path in base.stale_runs() if base is not None else []:
        pids = end_stale_cgroup(path, stop_timeout_s)
        if pids:
            fields: dict[str, Any] = {"cgroup": str(path), "pids": sorted(pids), "by": "cgroup"}
            records.append(_warning(Event.RECOVERED_ORPHAN, run_no, fields))
    child = previous_child(previous)
    if child is None:
        return records
    found = find_leftovers(child, home_id, current_boot)
    if found.refused or found.note:
        refused = {str(pid): why for pid, why in found.refused.items()}
        fields = {"pid": child.pid, "note": found.note, "refused": refused}
        records.append(_warning(Event.ORPHAN_NOT_OURS, child.run_no, fields))
    if found.proven:
        proven = sorted(found.proven)
        fields = {"pgid": child.pid, "pids": proven, "by": "pidfd"}
        records.append(_warning(Event.RECOVERED_ORPHAN, child.run_no, fields))
        end_proven(found.proven, stop_timeout_s)
    return records


def _warning(event: Event, run_no: int, fields: dict[str, Any]) -> WriteRecord:
    return WriteRecord(event, fields, log_level="warning", run_no=run_no)


def lost_run(previous: dict[str, Any], now_wall: float) -> RunFacts | None:
    """The previous daemon was killed while its run lived: that run's facts (its end unseen)."""
    child = previous_child(previous)
    last_exit = previous.get("last_exit") or {}
    if child is None or last_exit.get("run") == child.run_no:
        return None
    if previous.get("state") not in (State.STARTING, State.RUNNING, State.STOPPING):
        return None
    step = previous.get("step")
    return lost_facts(child.run_no, step if isinstance(step, int) else None, now_wall)
