"""After a daemon died without cleaning up: what it left, proven ours before anything is touched.

state.json names the child the previous daemon ran: its pid, create time, run number and
the boot it ran in.  A pid alone proves nothing (after a reboot or a pid wrap it belongs to
someone else), so a process is ours only if all of these hold:

- the same boot (``/proc/sys/kernel/random/boot_id``);
- born no earlier than the recorded child (the child itself: the same create time);
- it carries the mark only our child's processes carry: ``DFLASHD_HOME`` and ``DFLASHD_RUN``
  of that run in ``/proc/PID/environ``.

Without proof nothing is killed; the record says why.  With proof, the proven processes are
ended by pid (never by a group id that may have been reused).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from dflashd.supervisor.events import Event
from dflashd.supervisor.groups import ProcessOps, term_then_kill

BOOT_ID_PATH: Final = Path("/proc/sys/kernel/random/boot_id")
_SAME_CREATE_TIME_S: Final = 0.05  # create times are in clock ticks (1/100 s)


def boot_id() -> str | None:
    """This boot's id, or None where the kernel does not say."""
    try:
        return BOOT_ID_PATH.read_text().strip() or None
    except OSError:
        return None


def process_mark(pid: int) -> dict[str, str]:
    """``DFLASHD_HOME`` and ``DFLASHD_RUN`` from the environment ``pid`` started with."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, _, value = item.partition(b"=")
        if key in (b"DFLASHD_HOME", b"DFLASHD_RUN"):
            out[key.decode()] = value.decode("utf-8", "replace")
    return out


@dataclass(frozen=True, slots=True)
class PreviousChild:
    """What state.json recorded of the previous daemon's child (validated)."""

    pid: int
    run_no: int
    create_time: float | None
    boot_id: str | None


@dataclass
class Leftovers:
    """The verdict on one recorded child: which pids are proven ours, and what was refused."""

    proven: list[int] = field(default_factory=list)
    refused: dict[int, str] = field(default_factory=dict)
    note: str = ""


def find_leftovers(
    child: PreviousChild, ops: ProcessOps, home: Path, current_boot: str | None
) -> Leftovers:
    """Which processes of the previous run still live, proven ours (pure but for /proc reads)."""
    out = Leftovers()
    candidates = ops.group_members(child.pid)
    if ops.create_time(child.pid) is not None:
        candidates.add(child.pid)
    if not candidates:
        return out  # nothing left: the usual case (the child died with its daemon)
    if child.boot_id is None or current_boot is None:
        out.note = "no boot id recorded: cannot prove the processes are ours"
        return out
    if child.boot_id != current_boot:
        out.note = "the host rebooted since: the recorded pid is not ours"
        return out
    for pid in sorted(candidates):
        born = ops.create_time(pid)
        if born is None:
            continue
        if child.create_time is None:
            out.refused[pid] = "no create time recorded"
            continue
        if pid == child.pid and abs(born - child.create_time) > _SAME_CREATE_TIME_S:
            out.refused[pid] = "same pid, another process (create time differs)"
            continue
        if born + _SAME_CREATE_TIME_S < child.create_time:
            out.refused[pid] = "older than the recorded child"
            continue
        mark = process_mark(pid)
        if mark.get("DFLASHD_HOME") != str(home) or mark.get("DFLASHD_RUN") != str(child.run_no):
            out.refused[pid] = "does not carry this home's DFLASHD_HOME/DFLASHD_RUN"
            continue
        out.proven.append(pid)
    return out


def end_processes(ops: ProcessOps, pids: list[int], timeout_s: float) -> None:
    """SIGTERM each proven pid, SIGKILL the ones left after ``timeout_s`` (by pid, never a group)."""

    def send(signum: int) -> None:
        for pid in pids:
            ops.kill(pid, signum)

    def gone() -> bool:
        return all(ops.create_time(pid) is None or _is_zombie(pid) for pid in pids)

    term_then_kill(send, gone, timeout_s)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[-1].split()[0] == b"Z"
    except (OSError, IndexError):
        return True


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
    return PreviousChild(
        pid,
        run_no,
        float(created)
        if isinstance(created, int | float) and not isinstance(created, bool)
        else None,
        boot if isinstance(boot, str) else None,
    )


def recover(
    previous: dict[str, object],
    ops: ProcessOps,
    home: Path,
    current_boot: str | None,
    stop_timeout_s: float,
) -> list[tuple[Event, int, dict[str, object]]]:
    """End what the previous daemon left, once proven ours; the records to write (event, run, fields)."""
    child = previous_child(previous)
    if child is None:
        return []
    found = find_leftovers(child, ops, home, current_boot)
    records: list[tuple[Event, int, dict[str, object]]] = []
    if found.refused or found.note:
        refused = {str(pid): why for pid, why in found.refused.items()}
        records.append(
            (
                Event.ORPHAN_NOT_OURS,
                child.run_no,
                {"pid": child.pid, "note": found.note, "refused": refused},
            )
        )
    if found.proven:
        records.append(
            (Event.RECOVERED_ORPHAN, child.run_no, {"pgid": child.pid, "pids": found.proven})
        )
        end_processes(ops, found.proven, stop_timeout_s)
    return records
