"""Where a waiting process's other end is: a file lock's holder, a pipe's writers, a TCP peer.

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
from collections.abc import Collection
from typing import Final

from dflashd.supervisor.host.procfs import fd_links, thread_wchans

_LOCK_WAIT: Final = re.compile(r"lock_inode_wait|flock|posix_lock|fcntl|locks_")
_PIPE_WAIT: Final = re.compile(r"pipe_read|pipe_wait|fifo")
_FIFO_OPEN: Final = re.compile(r"wait_for_partner|fifo_open")  # open(2) of a FIFO, no peer yet
_SOCKET_WAIT: Final = re.compile(r"sk_wait_data|wait_woken|tcp_recvmsg|inet_csk_accept")


def outside_waits(
    pid: int, members: set[int], judged_tids: Collection[int] = ()
) -> tuple[str, ...]:
    """The waits of ``pid`` whose other end is outside ``members`` (the run), in words.

    ``judged_tids``: its threads with Python stacks outside any collective; only their socket
    reads are looked at (a collective's own sockets are the collective rule's, hang.py)."""
    chans = thread_wchans(pid)
    out: list[str] = []
    if any(_SOCKET_WAIT.search(chans.get(tid, "")) for tid in judged_tids):
        out.extend(_tcp_waits(pid, members))
    if any(_LOCK_WAIT.search(c) for c in chans.values()):
        out.extend(_lock_waits(pid, members))
    if any(_PIPE_WAIT.search(c) for c in chans.values()):
        out.extend(_pipe_waits(pid, members))
    if any(_FIFO_OPEN.search(c) for c in chans.values()):  # nobody has the other end yet
        out.append(f"pid {pid} waits for a FIFO's other end to open it, outside the run")
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


def _loopback(address: str) -> bool:
    """/proc/net/tcp's hex: 127.x.x.x (little-endian, so its last byte), ::1, or v4-mapped."""
    return (address.endswith("7F") and (len(address) == 8 or "FFFF0000" in address)) or (
        address == "00000000000000000000000001000000"
    )


def _tcp_waits(pid: int, members: set[int]) -> list[str]:
    """Established TCP connections of ``pid`` whose peer is another host, or a process on this
    one outside the run (a data server): a read from them waits on work elsewhere."""
    mine = _socket_inodes(pid)
    if not mine:
        return []
    table = _tcp_table()
    by_local = {local: inode for inode, (local, _) in table.items()}
    out = []
    for inode in sorted(mine & set(table)):
        _, remote = table[inode]
        if not _loopback(remote.split(":")[0]):
            out.append(f"pid {pid} reads from another host ({_shown(remote)}), outside the run")
            continue
        peer_inode = by_local.get(remote)
        owners = _owners(peer_inode) if peer_inode is not None else set()
        if owners and not owners & members:
            shown = ", ".join(f"pid {o}" for o in sorted(owners)[:3])
            out.append(f"pid {pid} reads a socket from {shown} ({_shown(remote)}), outside the run")
    return out


def _socket_inodes(pid: int) -> set[int]:
    links = fd_links(pid).values()
    return {
        int(link[8:-1]) for link in links if link.startswith("socket:[") and link[8:-1].isdigit()
    }


def _tcp_table() -> dict[int, tuple[str, str]]:
    """Established connections: inode -> (local, remote) as /proc/net/tcp{,6} write them."""
    out: dict[int, tuple[str, str]] = {}
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name, "rb") as fh:
                lines = fh.read().decode("ascii", "replace").splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            words = line.split()
            if len(words) > 9 and words[3] == "01" and words[9].isdigit():
                out[int(words[9])] = (words[1], words[2])
    return out


def _owners(inode: int) -> set[int]:
    wanted = f"socket:[{inode}]"
    return {pid for pid in _pids() if wanted in fd_links(pid).values()}


def _shown(address: str) -> str:
    """``7F000001:1F90`` -> ``port 8080`` (the address stays hex: it is for a person to match)."""
    host, _, port = address.partition(":")
    try:
        return f"{host}, port {int(port, 16)}"
    except ValueError:
        return address


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
