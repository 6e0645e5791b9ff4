"""The set's live file: one ``O_APPEND`` descriptor, whole records only, never through a link.

:class:`LiveFile` appends, cuts a failed write back to the last whole record, and before
each append checks that the name still names its file (deleted or replaced: reopened;
a link planted there: detached, appends refused until the name is usable again).  Once a
second it also checks the directory held (:class:`dflashd.logs.logdir.LogDir`): deleted,
it is made again; replaced by a link or another directory, the file keeps going into the
directory first opened and :meth:`LiveFile.take_notice` says so once, for a record.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from typing import Final

from dflashd.logs.linecodec import FrameRecords
from dflashd.logs.logdir import LogDir

VANISH_CHECK_S: Final = 1.0
IOV_MAX: Final = os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 16


def error_text(exc: OSError) -> str:
    """``ENOSPC: No space left on device``: how a write failure is named in records."""
    return f"{errno.errorcode.get(exc.errno or 0, 'EIO')}: {exc.strerror or exc}"


class LiveFile:
    """The file records are appended to, and what went wrong with it last."""

    def __init__(self, directory: LogDir, basename: str) -> None:
        self.dir, self.basename = directory, basename
        self.size = 0
        self.write_errors = 0
        self.last_error: str | None = None
        self._inode = (-1, -1)
        self._detached: str | None = None
        self._next_check = 0.0
        self._next_reopen = 0.0
        self._dir_state: str | None = None
        self._notice: str | None = None
        self.fd = self._adopt(directory.open_append(basename))

    def _adopt(self, fd: int) -> int:
        try:
            st = self.dir.fstat(fd)
        except OSError:
            os.close(fd)
            raise
        self.size = st.st_size
        self._inode = (st.st_dev, st.st_ino)
        return fd

    def replace_with(self, fd: int) -> None:
        """A rotation's new file becomes the live one (it already has the live name)."""
        try:
            adopted = self._adopt(fd)
        except OSError:  # it cannot even be stat-ed: the next append reopens the name
            adopted, self._inode = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC), (-1, -1)
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.fd = adopted

    def append(self, data: bytes | memoryview | list[bytes]) -> bool:
        """One append (``data`` whole, or its parts in one ``writev``: no joined copy of a
        batch); on failure the file is cut back so it holds whole records only."""
        self._check_vanished()
        if self._detached is not None:
            self.write_errors += 1
            self.last_error = self._detached
            return False
        parts = data if isinstance(data, list) else [data]
        total = sum(map(len, parts))
        written = 0
        try:
            if 1 < len(parts) <= IOV_MAX:
                written = self.dir.writev(self.fd, parts)
            if written < total:  # one part, too many, or a short writev: the rest from one buffer
                view = memoryview(parts[0] if len(parts) == 1 else b"".join(parts))
                while written < total:
                    written += self.dir.write(self.fd, view[written:])
        except OSError as exc:
            self.write_errors += 1
            self.last_error = error_text(exc)
            self._cut_back(written)
            return False
        self.size += written
        return True

    def append_records(self, frames: tuple[FrameRecords, ...], tail: bytes) -> int | None:
        """Scanned frames' records appended by one call that checks the name, encodes and
        writes without the GIL (``LogDir.append_records``): the bytes appended, or None when it
        did not apply (the directory's check is due, the file detached, its name moved, or the
        write failed: cut back, and left to :meth:`append`, which checks, reopens, writes again
        and counts what fails)."""
        if self._detached is not None or time.monotonic() >= self._next_check:
            return None
        try:
            written, _, err = self.dir.append_records(
                self.fd, self.basename, self._inode, frames, tail
            )
        except OSError:
            return None
        if err:
            self._cut_back(written)
            return None
        self.size += written
        return written

    def _cut_back(self, written: int) -> None:
        """A failed append's partial bytes off the file, so it holds whole records only."""
        if written:
            with contextlib.suppress(OSError):
                self.dir.ftruncate(self.fd, self.size)

    def take_notice(self) -> str | None:
        """What the directory check found since the last call (for one record), once."""
        notice, self._notice = self._notice, None
        return notice

    def _check_vanished(self) -> None:
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + VANISH_CHECK_S
            self._check_directory()
        try:
            st = self.dir.lstat(self.basename)
            if (st.st_dev, st.st_ino) == self._inode and self._detached is None:
                return
        except OSError:
            pass
        if self._detached is not None and now < self._next_reopen:
            return
        self._next_reopen = now + VANISH_CHECK_S
        try:
            fd = self._adopt(self.dir.open_append(self.basename))
        except OSError as exc:
            self._detached = f"cannot reopen {self.dir.path / self.basename}: {exc.strerror}"
            return
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.fd = fd
        self._detached = None

    def _check_directory(self) -> None:
        state = self.dir.check()
        if state == "deleted":
            try:
                self.dir.reopen()
                state = None
            except OSError as exc:
                self._detached = f"log directory {self.dir.path} deleted: {exc.strerror or exc}"
        if state == "replaced" and self._dir_state != "replaced":
            self.last_error = f"{self.dir.path} now names another directory or a link"
            self._notice = self.last_error
        self._dir_state = state

    def close(self) -> None:
        """Close the file and let the directory go (idempotent)."""
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1
            self.dir.close()
