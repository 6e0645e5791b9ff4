"""The log directory, held open: every file of the set is made relative to one descriptor.

:class:`LogDir` opens the directory once (``O_DIRECTORY | O_NOFOLLOW``) and creates,
renames and removes the set's files through that descriptor (``dir_fd=``), so a directory
swapped for a symlink while a run is live never receives a byte: the writer keeps writing
into the directory it opened, and :meth:`LogDir.check` says that the path now names
something else.  Its methods are also the writer's filesystem seam: a test subclass
raises ENOSPC, EROFS, EACCES, EIO or EDQUOT from any of them.

:func:`rotate_into_place` is the rotation: the new live file exists *before* anything is
renamed, so a directory out of inodes (or read-only) leaves the set exactly as it was.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from dflashd.logs.laterclose import close_later
from dflashd.logs.linecodec import CODEC, FrameRecords
from dflashd.logs.resume import numbered_names

_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# a file about to be removed, held so its blocks are freed elsewhere: O_PATH opens nothing (a
# FIFO or a device planted there is only referred to) and needs no read permission
_HOLD_FLAGS: Final = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_APPEND_FLAGS: Final = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
_NEW_FLAGS: Final = (
    os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
)
FILE_MODE: Final = 0o640


class LogDir:
    """One directory, held by descriptor; the writer's every file operation goes through here."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.fd = os.open(path, _DIR_FLAGS)
        st = os.fstat(self.fd)
        self._identity = (st.st_dev, st.st_ino)

    # -- the seam: one method per system call the writer makes ---------------------------

    def open_append(self, name: str) -> int:
        """The file ``name`` for appending (made 0640 if absent), never through a link."""
        return os.open(name, _APPEND_FLAGS, FILE_MODE, dir_fd=self.fd)

    def create_new(self, name: str) -> int:
        """A file that did not exist (``O_EXCL``): the next live file of a rotation."""
        return os.open(name, _NEW_FLAGS, FILE_MODE, dir_fd=self.fd)

    def lstat(self, name: str) -> os.stat_result:
        """``name``'s own entry (a link is not followed)."""
        return os.stat(name, dir_fd=self.fd, follow_symlinks=False)

    def rename(self, src: str, dst: str) -> None:
        """``src`` becomes ``dst`` (replacing it) within this directory."""
        os.rename(src, dst, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def unlink(self, name: str) -> None:
        """Remove ``name``; the file is held (``O_PATH``) across it and closed by the closer
        thread (:mod:`laterclose`), where its blocks are freed (100 MiB: ~55 ms on ext4), not
        here."""
        try:
            held = os.open(name, _HOLD_FLAGS, dir_fd=self.fd)
        except OSError:  # gone already: the unlink says so
            held = -1
        try:
            os.unlink(name, dir_fd=self.fd)
        finally:
            if held >= 0:
                close_later(held)

    def listdir(self) -> list[str]:
        """The names in the directory."""
        return os.listdir(self.fd)

    def write(self, fd: int, data: memoryview) -> int:
        """One ``write(2)``."""
        return os.write(fd, data)

    def writev(self, fd: int, parts: Sequence[bytes | memoryview]) -> int:
        """One ``writev(2)`` of at most ``IOV_MAX`` parts: a batch without joining it first."""
        return os.writev(fd, parts)

    def append_records(
        self,
        fd: int,
        name: str,
        inode: tuple[int, int],
        frames: tuple[FrameRecords, ...],
        tail: bytes,
    ) -> tuple[int, int, int]:
        """One ``write(2)`` of scanned frames' records, encoded in the same call, when ``name``
        still is the open file ``inode`` (``CODEC.append_records``, which says what it returns;
        where C was not built: nothing written, err -1, as for a name that moved)."""
        append = CODEC.append_records
        if append is None:
            return 0, 0, -1
        return append(fd, self.fd, os.fsencode(name), inode[0], inode[1], frames, tail)

    def ftruncate(self, fd: int, size: int) -> None:
        """Cut the file back (a failed write's partial record)."""
        os.ftruncate(fd, size)

    def fstat(self, fd: int) -> os.stat_result:
        """The open file's status."""
        return os.fstat(fd)

    # -- the directory itself -------------------------------------------------------------

    def check(self) -> str | None:
        """None while the path still names the directory held; else what happened to it.

        ``deleted``: the held directory has no name any more (removed).  ``replaced``: it
        still exists, but the path now names something else (a symlink, another directory).
        """
        try:
            if os.fstat(self.fd).st_nlink == 0:
                return "deleted"
            st = os.lstat(self.path)
        except OSError:
            return "replaced"
        if stat.S_ISLNK(st.st_mode) or (st.st_dev, st.st_ino) != self._identity:
            return "replaced"
        return None

    def reopen(self) -> None:
        """Hold the directory at the path again (after it was deleted and made anew): only a
        real directory, never a link, made owner-only if absent."""
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.path, 0o700)
        fd = os.open(self.path, _DIR_FLAGS)
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            os.close(fd)
            raise PermissionError(f"{self.path} is not a private directory of ours")
        os.close(self.fd)
        self.fd, self._identity = fd, (st.st_dev, st.st_ino)

    def close(self) -> None:
        """Let the directory go."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass(frozen=True, slots=True)
class Rotated:
    """A rotation done: ``newest`` is the name the old live file has now (None: it was dropped)."""

    newest: str | None


def rotate_into_place(ops: LogDir, basename: str, backups: int, new_name: str) -> Rotated:
    """The set's rotation, once ``new_name`` (the next live file) exists.

    ``base.1`` … ``base.K`` (the run of numbers without a gap) move up by one, the oldest
    leaving only when the run is ``backups`` long; then the live file becomes ``base.1`` and
    ``new_name`` the live file.  Raises OSError at the first step that fails, leaving every
    file that held records in place under some name (a failed step loses nothing; the next
    attempt fills the gap it left instead of removing another file).
    """
    if backups == 0:
        ops.rename(new_name, basename)  # the old live file goes: no history kept
        return Rotated(None)
    present = numbered_names(ops.listdir(), basename)
    top = 1
    while top in present and top <= backups:
        top += 1
    # 1..top-1 exist and top is free: shift that run up by one (top > backups: the oldest goes)
    for number in range(top - 1, 0, -1):
        for name in present[number]:
            suffix = name[len(f"{basename}.{number}") :]
            if number + 1 > backups:
                ops.unlink(name)
            else:
                ops.rename(name, f"{basename}.{number + 1}{suffix}")
    newest = f"{basename}.1"
    ops.rename(basename, newest)
    try:
        ops.rename(new_name, basename)
    except OSError:
        with contextlib.suppress(OSError):
            ops.rename(newest, basename)  # undo: the live file keeps its name
        raise
    return Rotated(newest)
