"""A log directory that fails on command: the writer's filesystem seam, for fault tests.

:class:`FaultyDir` is the real :class:`dflashd.logs.logdir.LogDir` (real files, real
renames), except that an operation named in ``failing`` raises the errno given there
instead of running.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dflashd.logs.linecodec import FrameRecords
from dflashd.logs.logdir import LogDir
from dflashd.logs.writer import RotatingLogWriter

OPERATIONS = ("write", "create_new", "open_append", "rename", "unlink", "listdir", "ftruncate")


class FaultyDir(LogDir):
    """``failing[op] = errno.ENOSPC`` makes ``op`` fail until the entry is removed."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.failing: dict[str, int] = {}
        self.raised = 0

    def _maybe_fail(self, op: str) -> None:
        code = self.failing.get(op)
        if code is not None:
            self.raised += 1
            raise OSError(code, os.strerror(code))

    def write(self, fd: int, data: memoryview) -> int:
        self._maybe_fail("write")
        return super().write(fd, data)

    def writev(self, fd: int, parts: Sequence[bytes | memoryview]) -> int:
        self._maybe_fail("write")
        return super().writev(fd, parts)

    def append_records(
        self,
        fd: int,
        name: str,
        inode: tuple[int, int],
        frames: tuple[FrameRecords, ...],
        tail: bytes,
    ) -> tuple[int, int, int]:
        self._maybe_fail("write")
        return super().append_records(fd, name, inode, frames, tail)

    def create_new(self, name: str) -> int:
        self._maybe_fail("create_new")
        return super().create_new(name)

    def open_append(self, name: str) -> int:
        self._maybe_fail("open_append")
        return super().open_append(name)

    def rename(self, src: str, dst: str) -> None:
        self._maybe_fail("rename")
        super().rename(src, dst)

    def unlink(self, name: str) -> None:
        self._maybe_fail("unlink")
        super().unlink(name)

    def listdir(self) -> list[str]:
        self._maybe_fail("listdir")
        return super().listdir()

    def ftruncate(self, fd: int, size: int) -> None:
        self._maybe_fail("ftruncate")
        super().ftruncate(fd, size)


ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EIO)


def faulty_writer(directory: Path, **options: Any) -> tuple[RotatingLogWriter, FaultyDir]:
    """A real writer on ``directory`` whose filesystem calls go through a :class:`FaultyDir`."""
    made: list[FaultyDir] = []

    def faulty(path: Path) -> FaultyDir:
        made.append(FaultyDir(path))
        return made[-1]

    writer = RotatingLogWriter(directory, fs=faulty, **options)
    return writer, made[0]
