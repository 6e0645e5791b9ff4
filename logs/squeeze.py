"""The compression helper: rotated files compressed in a process of its own, so the daemon
pays nothing for it (neither its CPU nor its GIL).

    python -I -S squeeze.py CODEC PARENT_PID [@DIRFD] FD=OUT [FD=OUT ...]
    python -I -S squeeze.py finish CODEC DAEMON_PID DIR|@DIRFD BASE BACKUPS [HELPER_PID]

``@DIRFD`` is the logs directory as the daemon holds it open (an inherited descriptor): the
helper changes into it (``fchdir``) and names every file relative to it, so a directory
swapped for a link meanwhile is never written, renamed or deleted in.

Reads each inherited descriptor ``FD`` (a rotated file, whatever it is named by now) and
writes ``OUT`` with ``CODEC`` (``zstd``: level 1; ``gzip``: level 6); a burst of rotations is
one helper, not one each.  ``OUT`` appears only whole (``OUT.part`` until then).

It starts as little as it can, since a busy run starts one per rotation: no site, nothing of
dflashd, and zstandard's C backend loaded from its file (``DFLASHD_ZSTD_HOME``, the folder
holding the package; the package's own import brings ``platform`` and ``typing`` and doubled
the start).  The daemon sets its priority (the idle CPU policy, nice 19, the idle I/O class)
from outside, so no ``ctypes`` either.  It gives up when its parent is gone (checked before
each file): a daemon never waits for it at exit.  What is left plain when the daemon ends goes
to ``finish``: a helper of its own session that waits for the daemon to be gone, then
compresses the rest (each file whole or not at all, under the locks a later daemon's writer
also takes).
"""

from __future__ import annotations

import io
import mmap
import os
import sys
from types import ModuleType

# Nothing from typing: its import (re, enum, collections...) was 20 ms of a 45 ms start.
ZSTD_LEVEL = 1  # ~30x on run logs at ~0.7-0.9 CPU s per GiB here (gzip -6: 22x, 8 s)
GZIP_LEVEL = 6
CHUNK = 1 << 20


class ParentGone(Exception):
    """The daemon died: the work is no longer wanted."""


def zstd_backend() -> ModuleType:
    """zstandard's C backend (``ZstdCompressor``), from its file where that works."""
    home = os.environ.get("DFLASHD_ZSTD_HOME", "")
    if home:
        sys.path.append(home)
        folder = os.path.join(home, "zstandard")
        try:
            names = sorted(n for n in os.listdir(folder) if n.startswith("backend_c."))
        except OSError:
            names = []
        if names:
            from importlib.machinery import ExtensionFileLoader, ModuleSpec

            path = os.path.join(folder, names[0])
            loader = ExtensionFileLoader("zstandard.backend_c", path)
            try:
                module = loader.create_module(
                    ModuleSpec("zstandard.backend_c", loader, origin=path)
                )
                loader.exec_module(module)
                return module
            except ImportError:
                pass
    import zstandard

    return zstandard


def squeeze(src: io.BufferedReader, dst: io.BufferedWriter, codec: str, parent: int) -> None:
    """``src`` from its start into ``dst``, while ``parent`` lives (0: whoever it is)."""
    if parent and os.getppid() != parent:
        raise ParentGone
    if codec == "zstd":
        # One shot over the mapped file: 20-35 % less CPU than zstandard's streaming paths here,
        # and the frame records the content size.  The output is ~1/30 of the input.
        size = os.fstat(src.fileno()).st_size
        compressor = zstd_backend().ZstdCompressor(level=ZSTD_LEVEL)
        if size == 0:
            dst.write(compressor.compress(b""))
            return
        with mmap.mmap(src.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            dst.write(compressor.compress(mapped))
        return
    import gzip

    src.seek(0)
    with gzip.GzipFile(
        filename="", mode="wb", fileobj=dst, compresslevel=GZIP_LEVEL, mtime=0
    ) as packed:
        while chunk := src.read(CHUNK):
            if parent and os.getppid() != parent:
                raise ParentGone
            packed.write(chunk)


def _wait_gone(pid: int) -> None:
    """Until process ``pid`` (the daemon handing over) has exited."""
    import select

    try:
        fd = os.pidfd_open(pid)
    except OSError:  # gone already, or no pidfds here: the parent's change says it
        while os.getppid() == pid:
            select.select([], [], [], 0.05)
        return
    try:
        select.select([fd], [], [], None)
    finally:
        os.close(fd)


def _plain(directory: str, base: str, backups: int) -> list[str]:
    """The set's rotated files still plain, oldest first."""
    names = set(os.listdir(directory))
    found = []
    for number in range(backups, 0, -1):
        name = f"{base}.{number}"
        if name in names and name + ".zst" not in names and name + ".gz" not in names:
            found.append(name)
    return found


def _place(
    directory: str, base: str, backups: int, tmp: str, inode: tuple[int, int], suffix: str
) -> None:
    """The packed file takes the plain one's place, wherever a rotation has moved it, under
    the rotation lock a running writer also takes (a new daemon may be rotating)."""
    import fcntl

    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    lock = os.open(os.path.join(directory, ".rotate.lock"), flags, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for number in range(1, backups + 1):
            path = os.path.join(directory, f"{base}.{number}")
            try:
                st = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if (st.st_dev, st.st_ino) == inode:
                os.replace(tmp, path + suffix)
                os.unlink(path)
                return
        os.unlink(tmp)  # it rotated out of the set meanwhile
    finally:
        os.close(lock)  # the flock goes with it


def _enter(where: str) -> str:
    """``@FD``: work in the directory held by that inherited descriptor (returns ".");
    a path is used as it is."""
    if where.startswith("@"):
        os.fchdir(int(where[1:]))
        return "."
    return where


def finish(argv: list[str]) -> int:
    """``finish CODEC DAEMON_PID DIR BASE BACKUPS [HELPER_PID [lock=FD]]``: the daemon has
    exited (waited for here) with rotated files still plain; compress them all.  Holds the
    home's compression lock, inherited from the daemon (``lock=FD``: locked there already, or
    taken here once another daemon's finisher lets it go), so no other compressor works on the
    set meanwhile."""
    codec, daemon, directory, base, backups = argv[0], int(argv[1]), argv[2], argv[3], int(argv[4])
    suffix = ".zst" if codec == "zstd" else ".gz"
    directory = _enter(directory)
    _wait_gone(daemon)
    if len(argv) > 5 and argv[5].isdigit() and argv[5] != "0":  # the daemon's helper, if one
        _wait_gone(int(argv[5]))  # was at work: it writes the same temporary names, gives up soon
    lock = next((a.removeprefix("lock=") for a in argv[5:] if a.startswith("lock=")), "")
    if lock.isdigit():
        import fcntl

        fcntl.flock(int(lock), fcntl.LOCK_EX)  # the same open file: no wait where it is held
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(3):  # a new daemon may rotate more meanwhile: look again, a few times
        todo = _plain(directory, base, backups)
        if not todo:
            return 0
        for name in todo:
            try:
                src_fd = os.open(
                    os.path.join(directory, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
                )
            except OSError:
                continue  # rotated out, or compressed by now
            st = os.fstat(src_fd)
            tmp = os.path.join(directory, f".compressing-{st.st_ino}{suffix}")
            try:
                with (
                    os.fdopen(src_fd, "rb") as src,
                    os.fdopen(os.open(tmp + ".part", flags, 0o640), "wb") as dst,
                ):
                    squeeze(src, dst, codec, 0)
                os.replace(tmp + ".part", tmp)
                _place(directory, base, backups, tmp, (st.st_dev, st.st_ino), suffix)
            except OSError:
                for leftover in (tmp, tmp + ".part"):
                    try:
                        os.unlink(leftover)
                    except OSError:
                        pass
    return 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "finish":
        return finish(argv[1:])
    codec, parent, jobs = argv[0], int(argv[1]), argv[2:]
    if jobs and jobs[0].startswith("@"):
        _enter(jobs.pop(0))
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    failed = 0
    for job in jobs:
        fd_text, _, out = job.partition("=")
        part = out + ".part"  # OUT appears only whole: a killed helper leaves a .part, never OUT
        if parent and os.getppid() != parent:
            return 1  # the daemon is gone: its finisher takes the rest (no .part made)
        try:
            with (
                os.fdopen(int(fd_text), "rb") as src,
                os.fdopen(os.open(part, flags, 0o640), "wb") as dst,
            ):
                squeeze(src, dst, codec, parent)
            os.replace(part, out)
        except ParentGone:
            try:
                os.unlink(part)  # given up: nothing of it stays behind
            except OSError:
                pass
            return 1
        except OSError:
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
