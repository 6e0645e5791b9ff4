"""A rotating JSON-lines writer: whole records only, rotation by rename, bounded total.

Files: ``<dir>/<base>`` is the live file, ``<base>.1`` the newest rotated one, up to
``<base>.<backups>``.  A batch of records is one ``write(2)`` on an ``O_APPEND`` fd, so a
reader never sees half a batch from a healthy disk, and a failed write is truncated
back so the file holds whole records only.

``seq`` is strictly increasing across rotations and across reopening the directory
after a crash: the writer continues from the last complete record on disk and cuts
off a torn last line.

Write failures (disk full, file gone read-only) are counted, never raised: the caller
is a pipe-draining path.  When writing works again, a ``log_dropped`` record says how
much was lost.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from dflashd.logs.compress import Compressor, remove_stale_tmp
from dflashd.logs.framer import Frame
from dflashd.logs.records import encode_event, encode_frame, utc_timestamp
from dflashd.logs.resume import plain_rotated, recover_tail, shift_rotated

DEFAULT_BASENAME: Final = "dflashd.jsonl"
DEFAULT_MAX_BYTES: Final = 100 * 1024 * 1024
DEFAULT_BACKUPS: Final = 10
MIN_MAX_BYTES: Final = 1024  # a smaller bound would rotate on nearly every record
_VANISH_CHECK_S: Final = 1.0


class LogWriterError(Exception):
    """The log cannot be opened at all (missing permission, not a directory): a clear, one-line cause."""


@dataclass(frozen=True, slots=True)
class WriterStats:
    """Counters a caller can report (``status``, metrics)."""

    records_written: int
    bytes_written: int
    records_dropped: int
    bytes_dropped: int
    write_errors: int
    rotations: int
    last_error: str | None


class RotatingLogWriter:
    """Appends records to a rotating set of JSON-lines files. Thread-safe."""

    def __init__(
        self,
        directory: Path | str,
        *,
        basename: str = DEFAULT_BASENAME,
        max_bytes: int = DEFAULT_MAX_BYTES,
        backups: int = DEFAULT_BACKUPS,
        clock: Callable[[], float] = time.time,
        compress: bool = False,
    ) -> None:
        if max_bytes < MIN_MAX_BYTES:
            raise ValueError(f"max_bytes must be at least {MIN_MAX_BYTES}")
        if backups < 0:
            raise ValueError("backups must be >= 0")
        self.directory = Path(directory)
        self.basename = basename
        self.path = self.directory / basename
        self.max_bytes = max_bytes
        self.backups = backups
        self._clock = clock
        self._lock = threading.Lock()
        self._records_written = 0
        self._bytes_written = 0
        self._records_dropped = 0
        self._bytes_dropped = 0
        self._unreported_records = 0
        self._unreported_bytes = 0
        self._write_errors = 0
        self._rotations = 0
        self._last_error: str | None = None
        self._next_check = 0.0
        self._detached: str | None = None
        self.torn_bytes = 0
        self.last_run = 0
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self.next_seq, self.last_run, self.torn_bytes = recover_tail(
                self.directory, self.basename, self.backups
            )
            self._fd = self._open()
        except OSError as exc:
            raise LogWriterError(f"cannot open log {self.path}: {exc.strerror or exc}") from None
        self.compressor: Compressor | None = None  # rotated files' helper (drain: tests)
        if compress:
            remove_stale_tmp(self.directory)
            self.compressor = Compressor(self.directory, self._lock, self._plain_rotated)
            for path in self._plain_rotated():  # what a previous daemon left plain, oldest first
                self._submit(path)

    # -- opening and recovery ---------------------------------------------------------

    def _open(self) -> int:
        # Never through a symlink: a link planted at the log's name would redirect our writes.
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        fd = os.open(self.path, flags, 0o640)
        st = os.fstat(fd)
        self._size = st.st_size
        self._inode = (st.st_dev, st.st_ino)
        return fd

    # -- encoding -----------------------------------------------------------------------

    # -- writing ------------------------------------------------------------------------

    def write_frame(self, run: int, src: str, frame: Frame, wall_s: float | None = None) -> bool:
        """Write the lines of one frame as ``src`` records of ``run``. Never raises on I/O failure."""
        if not len(frame):
            return True
        ts = utc_timestamp(self._clock() if wall_s is None else wall_s)
        with self._lock:
            if self._unreported_records:
                self._report_drops()
            data = encode_frame(run, src, frame, ts, self.next_seq)
            self.last_run = run
            return self._append(data, len(frame))

    def write_frames(self, batch: list[tuple[int, str, Frame, float]]) -> bool:
        """Write several frames (run, src, frame, wall time) in one append: one syscall for many chunks."""
        with self._lock:
            if self._unreported_records:
                self._report_drops()
            seq = self.next_seq
            parts = []
            for run, src, frame, wall_s in batch:
                if len(frame):
                    parts.append(encode_frame(run, src, frame, utc_timestamp(wall_s), seq))
                    seq += len(frame)
                    self.last_run = run
            if not parts:
                return True
            return self._append(b"".join(parts), seq - self.next_seq)

    def write_event(self, run: int, event: str, fields: dict[str, Any] | None = None) -> int | None:
        """Write one supervisor record; returns its seq, or None when it was dropped."""
        ts = utc_timestamp(self._clock())
        with self._lock:
            if self._unreported_records:
                self._report_drops()
            seq = self.next_seq
            data = encode_event(run, event, fields or {}, ts, seq)
            self.last_run = run
            return seq if self._append(data, 1) else None

    def _append(self, data: bytes, count: int) -> bool:
        """Append whole records, rotating within one record of ``max_bytes`` (a batch may span files).

        Only a file that grew is rotated: when a part cannot be written (a full disk), the
        rest of the batch is dropped and counted, and the set keeps its history; rotating
        on a failure would push intact files out for empty ones.
        """
        while data and self._size + len(data) > self.max_bytes:
            cut = data.rfind(b"\n", 0, self.max_bytes - self._size) + 1
            if cut <= 0 and self._size > 0:  # not one more record fits here: the next file
                self._rotate()
                continue
            if cut <= 0:  # one record larger than the bound: alone in its own file
                cut = data.find(b"\n") + 1 or len(data)
            part, data = data[:cut], data[cut:]
            records = part.count(b"\n")
            if not self._append_part(part, records):
                self._count_dropped(data, count - records)
                return False
            count -= records
            if self._size > 0:
                self._rotate()
        return self._append_part(data, count) if data else True

    def _count_dropped(self, data: bytes, count: int) -> None:
        self._records_dropped += count
        self._bytes_dropped += len(data)
        self._unreported_records += count
        self._unreported_bytes += len(data)

    def _append_part(self, data: bytes, count: int) -> bool:
        if not self._write_all(data):
            self._count_dropped(data, count)
            return False
        self.next_seq += count
        self._records_written += count
        self._bytes_written += len(data)
        if self._size >= self.max_bytes:
            self._rotate()
        return True

    def note_dropped(self, records: int, nbytes: int, error: str) -> None:
        """Drops made upstream (the sink, past a stalled disk): the next ``log_dropped`` says so.

        The one writer of ``log_dropped`` records is this class: its counts are the
        writer's own drops plus these.
        """
        with self._lock:
            self._unreported_records += records
            self._unreported_bytes += nbytes
            self._last_error = error

    def _report_drops(self) -> None:
        ts = utc_timestamp(self._clock())
        fields = {
            "records": self._unreported_records,
            "bytes": self._unreported_bytes,
            "error": self._last_error,
        }
        data = encode_event(self.last_run, "log_dropped", fields, ts, self.next_seq)
        if self._write_all(data):
            self.next_seq += 1
            self._records_written += 1
            self._bytes_written += len(data)
            self._unreported_records = 0
            self._unreported_bytes = 0

    def _write_all(self, data: bytes) -> bool:
        """One append; on failure the file is cut back so it holds whole records only."""
        self._check_vanished()
        if self._detached is not None:
            self._write_errors += 1
            self._last_error = self._detached
            return False
        view = memoryview(data)
        written = 0
        try:
            while written < len(data):
                written += os.write(self._fd, view[written:])
        except OSError as exc:
            self._write_errors += 1
            self._last_error = f"{errno.errorcode.get(exc.errno or 0, 'EIO')}: {exc.strerror}"
            if written:
                try:
                    os.ftruncate(self._fd, self._size)
                except OSError:
                    pass
            return False
        self._size += written
        return True

    def _check_vanished(self) -> None:
        """Before each append: is the live file still ours?  Deleted or replaced: reopen first.

        One lstat per batch, so records are never written into a file someone deleted.  A
        path that cannot be reopened safely (a symlink planted there, a directory) detaches
        the writer: appends are dropped and counted until the path is usable again.
        """
        try:
            st = os.lstat(self.path)
            if (st.st_dev, st.st_ino) == self._inode and self._detached is None:
                return
        except OSError:
            pass
        now = time.monotonic()
        if self._detached is not None and now < self._next_check:
            return
        self._next_check = now + _VANISH_CHECK_S
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = self._open()
        except OSError as exc:
            self._detached = f"cannot reopen {self.path}: {exc.strerror}"
            return
        os.close(self._fd)
        self._fd = fd
        self._detached = None

    def _rotate(self) -> None:
        os.close(self._fd)
        try:
            if self.backups == 0:
                os.unlink(self.path)
            else:
                shift_rotated(self.directory, self.basename, self.backups)
                newest = self.directory / f"{self.basename}.1"
                os.rename(self.path, newest)
                self._submit(newest)
        except FileNotFoundError:
            pass  # someone removed the files; start a fresh one below
        self._rotations += 1
        try:
            self._fd = self._open()
        except OSError as exc:
            self._last_error = f"cannot open {self.path} after rotation: {exc.strerror}"
            self._fd = os.open(os.devnull, os.O_WRONLY)
            self._inode = (-1, -1)
            self._detached = self._last_error
            self._next_check = 0.0

    # -- lifecycle ----------------------------------------------------------------------

    def stats(self) -> WriterStats:
        """A snapshot of the counters."""
        with self._lock:
            return WriterStats(
                records_written=self._records_written,
                bytes_written=self._bytes_written,
                records_dropped=self._records_dropped,
                bytes_dropped=self._bytes_dropped,
                write_errors=self._write_errors,
                rotations=self._rotations,
                last_error=self._last_error,
            )

    def _plain_rotated(self) -> list[Path]:
        return plain_rotated(self.directory, self.basename, self.backups)

    def _submit(self, path: Path) -> None:
        """Hand a rotated file to the compressor (opened now, so later renames do not matter)."""
        if self.compressor is None or path.is_symlink():
            return
        try:
            fh = open(path, "rb")  # the compressor closes it
        except OSError:
            return
        self.compressor.submit(fh)

    def close(self) -> None:
        """Close the live file (idempotent); wait at most 1 s for the compression helper."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
        if self.compressor is not None:
            self.compressor.close()
            self.compressor = None

    def __enter__(self) -> RotatingLogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
