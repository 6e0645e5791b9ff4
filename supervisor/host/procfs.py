"""Reading /proc: what a process is (pid, start time, group, parent), the mark it started with.

Pure parsers and thin readers, no signals: :mod:`custody` proves with them, recovery reads
them.  A pid alone names nothing; (pid, start ticks) names one process for its whole life.
"""

from __future__ import annotations

import contextlib
import os
import pwd
from dataclasses import dataclass
from pathlib import Path
from typing import Final

CLK_TCK: Final = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
MARK_HOME_ID: Final = "DFLASHD_HOME_ID"
MARK_RUN: Final = "DFLASHD_RUN"


@dataclass(frozen=True, slots=True)
class ProcStat:
    """The fields of ``/proc/PID/stat`` custody needs."""

    pid: int
    state: str
    ppid: int
    pgid: int
    start_ticks: int  # since boot, in clock ticks: with the pid, a process's identity
    cpu_ticks: int = 0  # utime + stime + cutime + cstime
    processor: int = -1  # the CPU it last ran on


def parse_stat(pid: int, raw: bytes) -> ProcStat | None:
    """Parse ``/proc/PID/stat`` (the command name may hold spaces and parentheses)."""
    try:
        rest = raw.rsplit(b")", 1)[1].split()
        cpu = sum(int(x) for x in rest[11:15])
        cpu_now = int(rest[36]) if len(rest) > 36 else -1
        return ProcStat(
            pid, rest[0].decode(), int(rest[1]), int(rest[2]), int(rest[19]), cpu, cpu_now
        )
    except (IndexError, ValueError):
        return None


def read_stat(pid: int) -> ProcStat | None:
    """The stat of ``pid`` now, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return parse_stat(pid, fh.read())
    except OSError:
        return None


def all_stats() -> dict[int, ProcStat]:
    """Every process on the host (one pass over /proc)."""
    out: dict[int, ProcStat] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if name.isdigit() and (found := read_stat(int(name))) is not None:
            out[found.pid] = found
    return out


def process_mark(pid: int) -> dict[str, str]:
    """``DFLASHD_HOME_ID``, ``DFLASHD_RUN`` (and ``DFLASHD_HOME``) from ``pid``'s start environment."""
    return environ_values(pid, (MARK_HOME_ID, MARK_RUN, "DFLASHD_HOME"))


def environ_values(pid: int, keys: tuple[str, ...]) -> dict[str, str]:
    """The values of ``keys`` in ``pid``'s start environment (what is missing is left out)."""
    wanted = {k.encode() for k in keys}
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return {}
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, _, value = item.partition(b"=")
        if key in wanted:
            out[key.decode()] = value.decode("utf-8", "replace")
    return out


def io_bytes(pid: int) -> tuple[int | None, int | None]:
    """(read, written): the bytes ``pid`` passed through read(2) and write(2) so far
    (``/proc/PID/io`` rchar and wchar), None where unreadable."""
    read: int | None = None
    written: int | None = None
    try:
        with open(f"/proc/{pid}/io", "rb") as fh:
            for line in fh:
                if line.startswith(b"rchar:"):
                    read = int(line.split()[1])
                elif line.startswith(b"wchar:"):
                    written = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None, None
    return read, written


def per_thread(pid: int, name: str, limit: int = 4096) -> dict[int, bytes]:
    """``/proc/PID/task/TID/<name>`` of each of ``pid``'s threads (the ones readable now)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    out: dict[int, bytes] = {}
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/{name}", "rb") as fh:
                out[int(tid)] = fh.read(limit)
        except (OSError, ValueError):
            continue
    return out


def fd_links(pid: int) -> dict[int, str]:
    """What each of ``pid``'s descriptors names (``socket:[N]``, ``pipe:[N]``, a path), by fd."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return {}
    out: dict[int, str] = {}
    for name in names:
        with contextlib.suppress(OSError, ValueError):
            out[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
    return out


def thread_wchans(pid: int) -> dict[int, str]:
    """The kernel function each of ``pid``'s threads sleeps in, by tid (``wchan``:
    ``futex_wait_queue``, ``pipe_read``, ``locks_lock_inode_wait``...; "0" when running)."""
    return {
        tid: raw.decode("ascii", "replace") for tid, raw in per_thread(pid, "wchan", 128).items()
    }


def thread_states(pid: int) -> tuple[str, ...]:
    """The state letter of each of ``pid``'s threads (R, S, D, ...), from /proc/PID/task."""
    out = []
    for raw in per_thread(pid, "stat").values():
        with contextlib.suppress(IndexError):
            out.append(raw.rsplit(b")", 1)[1].split()[0].decode())
    return tuple(out)


def run_queue_wait_ns(pid: int) -> int:
    """Nanoseconds ``pid``'s threads have spent runnable but waiting for a CPU (the second
    field of /proc/PID/task/TID/schedstat, summed; 0 where the kernel keeps no schedstats)."""
    total = 0
    for raw in per_thread(pid, "schedstat", 128).values():
        fields = raw.split()
        if len(fields) >= 2 and fields[1].isdigit():
            total += int(fields[1])
    return total


def owner_name(pid: int) -> str | None:
    """The user ``pid`` runs as (its real uid's name, or the number), None when it is gone."""
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def cmdline_text(pid: int, limit: int = 200) -> str:
    """``pid``'s command line, joined by spaces and cut at ``limit`` ("" when it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            raw = fh.read(limit * 4)
    except OSError:
        return ""
    return raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")[:limit]


def carries_mark(pid: int, home_id: str, run_no: int | None) -> bool:
    """True when ``pid`` started with this home's id and (when given) this run's number."""
    mark = process_mark(pid)
    if mark.get(MARK_HOME_ID) != home_id or not home_id:
        return False
    return run_no is None or mark.get(MARK_RUN) == str(run_no)


def boot_time_s() -> float:
    """When the host booted (seconds since the epoch), from ``/proc/stat``."""
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0.0


def create_time(pid: int) -> float | None:
    """When ``pid`` was created (seconds since the epoch), None when it is gone."""
    found = read_stat(pid)
    return None if found is None else boot_time_s() + found.start_ticks / CLK_TCK


def holds_file(pid: int, path: Path) -> bool:
    """True when ``pid`` has ``path`` open (one of its descriptors is that very inode)."""
    try:
        target = os.stat(path)
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            st = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
            return True
    return False


def child_pids(pid: int) -> set[int] | None:
    """``pid``'s children now, from ``/proc/PID/task/*/children`` (one read per thread, not a
    scan of /proc); an empty set when it is gone, None where the kernel does not list them."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return set()
    out: set[int] = set()
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                text = fh.read()
        except FileNotFoundError:
            if os.path.isdir(f"/proc/{pid}/task/{tid}"):
                return None  # no CONFIG_PROC_CHILDREN on this kernel
            continue
        except OSError:
            continue
        out.update(int(word) for word in text.split())
    return out
