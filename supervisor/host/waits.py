"""Where a waiting process's other end is: a file lock's holder, a pipe's writers.

A thread asleep in the kernel says on what (``/proc/PID/task/TID/wchan``): a file lock
(``locks_lock_inode_wait``), a pipe read (``pipe_read``), a futex, a socket.  For a file lock
the holder is in ``/proc/locks``; for a pipe the writers are the processes holding it open
for writing.  When that end is outside the run (a sibling job holding the lock while it
computes, a producer filling a FIFO late) the wait is not the run's own: the hang decider
never ends the run for it (hang.py, ``waits_elsewhere``).  Reads only; bounded to the
processes being sampled.
"""

from __future__ import annotations

import os
import re
import stat
from typing import Final

from dflashd.supervisor.host.procfs import thread_wchans

_LOCK_WAIT: Final = re.compile(r"lock_inode_wait|flock|posix_lock|fcntl|locks_")
_PIPE_WAIT: Final = re.compile(r"pipe_read|pipe_wait|fifo")


def outside_waits(pid: int, members: set[int]) -> tuple[str, ...]:
    """The waits of ``pid`` whose other end is outside ``members`` (the run), in words."""
    chans = thread_wchans(pid)
    out: list[str] = []
    if any(_LOCK_WAIT.search(c) for c in chans):
        out.extend(_lock_waits(pid, members))
    if any(_PIPE_WAIT.search(c) for c in chans):
        out.extend(_pipe_waits(pid, members))
    return tuple(out)


def _lock_waits(pid: int, members: set[int]) -> list[str]:
    """A lock ``pid`` waits for (a ``->`` line of /proc/locks) held outside the run."""
    try:
        with open("/proc/locks", "rb") as fh:
            lines = fh.read().decode("ascii", "replace").splitlines()
    except OSError:
        return []
    waited: set[str] = set()
    holders: dict[str, set[int]] = {}
    for line in lines:
        words = line.split()
        blocked = "->" in words
        if blocked:
            words.remove("->")
        if len(words) < 6 or not words[4].lstrip("-").isdigit():
            continue
        owner, where = int(words[4]), words[5]
        if blocked and owner == pid:
            waited.add(where)
        elif not blocked:
            holders.setdefault(where, set()).add(owner)
    out = []
    for where in sorted(waited):
        held_by = holders.get(where, set())
        if held_by and held_by <= members:
            continue  # a lock of the run's own: its holder is judged with it
        shown = ", ".join(f"pid {p}" for p in sorted(held_by)) or "a process dflashd cannot see"
        inode = where.rsplit(":", 1)[-1]
        out.append(
            f"pid {pid} waits on a file lock (inode {inode}) held by {shown}, outside the run"
        )
    return out


def _pipe_waits(pid: int, members: set[int]) -> list[str]:
    """Pipes ``pid`` holds for reading whose writers are all outside the run."""
    pipes = {ident: fd for fd, ident, mode in _fds(pid) if mode != os.O_WRONLY}
    if not pipes:
        return []
    writers: dict[tuple[int, int], set[int]] = {ident: set() for ident in pipes}
    for other in _pids():
        if other == pid:
            continue
        for _, ident, mode in _fds(other):
            if ident in writers and mode != os.O_RDONLY:
                writers[ident].add(other)
    out = []
    for ident, found in sorted(writers.items()):
        if not found or found & members:
            continue  # nobody writes it (EOF is coming), or the run itself does
        shown = ", ".join(f"pid {p}" for p in sorted(found)[:3])
        out.append(f"pid {pid} reads a pipe (inode {ident[1]}) written by {shown}, outside the run")
    return out


def _fds(pid: int) -> list[tuple[int, tuple[int, int], int]]:
    """(fd, (dev, inode), access mode) of each pipe or FIFO ``pid`` holds open."""
    folder = f"/proc/{pid}/fd"
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    out = []
    for name in names:
        try:
            st = os.stat(f"{folder}/{name}")
        except OSError:
            continue
        if not stat.S_ISFIFO(st.st_mode):
            continue
        mode = _access_mode(pid, name)
        if mode is not None:
            out.append((int(name), (st.st_dev, st.st_ino), mode))
    return out


def _access_mode(pid: int, fd: str) -> int | None:
    try:
        with open(f"/proc/{pid}/fdinfo/{fd}", "rb") as fh:
            for line in fh:
                if line.startswith(b"flags:"):
                    return int(line.split()[1], 8) & os.O_ACCMODE
    except (OSError, ValueError, IndexError):
        return None
    return None


def _pids() -> list[int]:
    try:
        return [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return []
