"""A rotating JSON-lines writer: whole records only, rotation by rename, bounded total.

Files: ``<dir>/<base>`` is the live file, ``<base>.1`` the newest rotated one, up to
``<base>.<backups>``.  A batch of records is one ``write(2)`` (or one ``writev(2)`` of its
frames' records, never joined into a copy first) on an ``O_APPEND`` fd, so a reader never sees
half a batch from a healthy disk, and a failed write is truncated back so the file holds whole
records only.

``seq`` is strictly increasing across rotations and across reopening the directory
after a crash: the writer continues from the last complete record on disk and cuts
off a torn last line.

Write failures (disk full, file gone read-only) are counted, never raised: the caller
is a pipe-draining path.  When writing works again, a ``log_dropped`` record says how
much was lost.

Every file is made through the directory held open (:class:`dflashd.logs.logdir.LogDir`):
a logs directory swapped for a symlink mid-run never receives a byte.  A rotation makes
its new live file first; when it cannot (no inodes left, the directory read-only for a
moment) the set is left exactly as it was, the live file keeps growing past its bound
(counted, one ``log_rotation_failed`` record) and the rotation is tried again a second
later: rotated history is never lost to a failing rotation.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from dflashd.logs.compress import EXIT_WAIT_S, Compressor, remove_stale_tmp, rotation_lock
from dflashd.logs.drops import Drops
from dflashd.logs.framer import Frame
from dflashd.logs.limits import DEFAULT_BASENAME, MIN_MAX_BYTES
from dflashd.logs.livefile import LiveFile, error_text
from dflashd.logs.logdir import LogDir, rotate_into_place
from dflashd.logs.records import (
    RECORD_END,
    encode_event,
    encode_frame,
    scanned_batch,
    utc_timestamp,
)
from dflashd.logs.resume import plain_rotated, recover_tail

DEFAULT_MAX_BYTES: Final = 100 * 1024 * 1024
DEFAULT_BACKUPS: Final = 10

ROTATE_RETRY_S: Final = 1.0  # a rotation that failed is tried again this much later


Records = bytes | memoryview | list[bytes]  # records to write: whole, a view of some, or in parts


def _nbytes(data: Records) -> int:
    """The length of records to write, whole or in parts."""
    return sum(map(len, data)) if isinstance(data, list) else len(data)


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
    rotation_failures: int = 0  # rotations that could not be made (the live file grew on)


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
        fs: Callable[[Path], LogDir] = LogDir,
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
        self._drops = Drops()
        self._rotations = 0
        self._rotation_failures = 0
        self._rotate_retry_at = 0.0
        self._rotation_failing = False
        # the writer's own records met inside a batch: written after it (its seqs are taken)
        self._own: list[tuple[str, dict[str, Any]]] = []
        self.torn_bytes = 0
        self.last_run = 0
        self._new_name = f".{basename}.new"
        try:
            self._dir = fs(self.directory)
            self.next_seq, self.last_run, self.torn_bytes = recover_tail(
                self.directory, self.basename, self.backups
            )
            with contextlib.suppress(OSError):  # a rotation a killed daemon left half-made
                self._dir.unlink(self._new_name)
            self._live = LiveFile(self._dir, basename)
        except OSError as exc:
            raise LogWriterError(f"cannot open log {self.path}: {exc.strerror or exc}") from None
        self.compressor: Compressor | None = None  # rotated files' helper (drain: tests)
        self.finisher: Any = None  # the helper that finishes compressing after close (tests)
        if compress:
            remove_stale_tmp(self._dir.fd)
            rotated, held = self._plain_rotated, self._dir.fd
            self.compressor = Compressor(self.directory, self._lock, rotated, dir_fd=held)
            for name in self._plain_rotated():  # what a previous daemon left plain, oldest first
                self.compressor.submit_name(held, name)

    # -- writing ------------------------------------------------------------------------

    def write_frame(self, run: int, src: str, frame: Frame, wall_s: float | None = None) -> bool:
        """Write the lines of one frame as ``src`` records of ``run``. Never raises on I/O failure."""
        return self.write_frames([(run, src, frame, self._clock() if wall_s is None else wall_s)])

    def write_frames(self, batch: list[tuple[int, str, Frame, float]]) -> bool:
        """Write several frames (run, src, frame, wall time) in one append: one syscall for many chunks."""
        with self._lock:
            if self._drops.unreported_records:
                self._report_drops()
            if self._append_scanned(batch):
                self._write_own()
                return True
            seq = self.next_seq
            parts = []
            for run, src, frame, wall_s in batch:
                if len(frame):
                    parts.append(encode_frame(run, src, frame, utc_timestamp(wall_s), seq))
                    seq += len(frame)
                    self.last_run = run
            if not parts:
                return True
            return self._append(parts, seq - self.next_seq)

    def _append_scanned(self, batch: list[tuple[int, str, Frame, float]]) -> bool:
        """Scanned frames in one C call, no GIL (issue 53); False: not for this batch, unwritten."""
        scanned = scanned_batch(batch, self.next_seq, self.max_bytes - self._live.size)
        if (
            scanned is None
            or (written := self._live.append_records(scanned.frames, RECORD_END)) is None
        ):
            return False
        self.last_run = scanned.last_run
        self._wrote(scanned.next_seq - self.next_seq, written)
        return True

    def write_event(
        self,
        run: int,
        event: str,
        fields: dict[str, Any] | None = None,
        *,
        count_drop: bool = True,
    ) -> int | None:
        """Write one supervisor record; its seq, or None when not written (``count_drop=False``:
        not counted as a drop either: the caller keeps it and writes it again, as the sink does)."""
        ts = utc_timestamp(self._clock())
        with self._lock:
            if self._drops.unreported_records:
                self._report_drops()
            seq = self.next_seq
            data = encode_event(run, event, fields or {}, ts, seq)
            self.last_run = run
            return seq if self._append(data, 1, counted=count_drop) else None

    def count_dropped(self, records: int, nbytes: int, error: str) -> None:
        """Drops made upstream that the writer never saw (counted in its stats too), and why."""
        with self._lock:
            self._drops.lost(records, nbytes)
            self._drops.error = error

    def _append(self, data: bytes | list[bytes], count: int, *, counted: bool = True) -> bool:
        """Append whole records, rotating within one record of ``max_bytes`` (a batch may span files).

        Only a file that grew is rotated: when a part cannot be written (a full disk), the
        rest of the batch is dropped and counted, and the set keeps its history; rotating
        on a failure would push intact files out for empty ones.  While rotation fails, the
        live file takes the whole batch past its bound.  ``counted=False``: what cannot be
        written is not counted as dropped (the caller keeps it and writes it again).
        """
        try:
            if isinstance(data, list):  # the frames' records, written as they are where they fit
                if self._live.size + _nbytes(data) <= self.max_bytes:
                    return self._append_part(data, count, counted)
                data = b"".join(data)  # a rotation falls inside: cut at a record's end
            return self._append_batch(data, count, counted)
        finally:  # the writer's own records, after the batch: its seqs are taken already
            self._write_own()

    def _write_own(self) -> None:
        """The writer's own records met inside a batch (a rotation's), after it."""
        while self._own:
            event, fields = self._own.pop(0)
            self._record_self(event, fields)

    def _append_batch(self, data: bytes, count: int, counted: bool) -> bool:
        # Cut at records' ends by offset, each piece written through a view: slicing the
        # bytes copied a batch twice more at every rotation (issue 53: the writer's peak memory).
        live, view, start, end = self._live, memoryview(data), 0, len(data)
        while start < end and live.size + end - start > self.max_bytes and self._may_rotate():
            cut = data.rfind(b"\n", start, start + self.max_bytes - live.size) + 1
            if cut <= start and live.size > 0:  # not one more record fits here: the next file
                if not self._rotate():
                    break  # the rest goes into this file, past its bound
                continue
            if cut <= start:  # one record larger than the bound: alone in its own file
                cut = data.find(b"\n", start) + 1 or end
            records = data.count(b"\n", start, cut)
            if not self._append_part(view[start:cut], records, counted):
                if counted:
                    self._drops.lost(count - records, end - cut)
                return False
            count -= records
            start = cut
            if live.size > 0 and not self._rotate():
                break
        return self._append_part(view[start:], count, counted) if start < end else True

    def _append_part(self, data: Records, count: int, counted: bool = True) -> bool:
        if not self._write_all(data):
            if counted:
                self._drops.lost(count, _nbytes(data))
            return False
        self._wrote(count, _nbytes(data))
        return True

    def _wrote(self, count: int, nbytes: int) -> None:
        self.next_seq += count
        self._records_written += count
        self._bytes_written += nbytes
        if self._live.size >= self.max_bytes:
            self._rotate()

    def note_dropped(self, records: int, nbytes: int, error: str) -> None:
        """Drops made upstream (the sink, past a stalled disk): the next ``log_dropped`` says so.

        The one writer of ``log_dropped`` records is this class: its counts are the
        writer's own drops plus these.
        """
        with self._lock:
            self._drops.noted(records, nbytes, error)

    def _report_drops(self) -> None:
        drops = self._drops
        fields = {
            "records": drops.unreported_records,
            "bytes": drops.unreported_bytes,
            "error": drops.error or self._live.last_error,
        }
        if self._record_self("log_dropped", fields):
            drops.unreported_records = drops.unreported_bytes = 0
            drops.error = None

    def _write_all(self, data: Records) -> bool:
        written = self._live.append(data)
        notice = self._live.take_notice()
        if notice is not None:  # the directory was swapped: said once, in the one we hold
            self._own.append(("log_dir_replaced", {"path": str(self.directory), "error": notice}))
        return written

    def _may_rotate(self) -> bool:
        return time.monotonic() >= self._rotate_retry_at

    def _rotate(self) -> bool:
        """Rotate, or leave the set as it is and say why (True when rotated).

        The next live file is made first: without it nothing is renamed.  Any step that
        fails leaves every record on disk, the live file growing past its bound until a
        retry (``ROTATE_RETRY_S`` later) succeeds.
        """
        if not self._may_rotate():
            return False
        try:
            new_fd = self._dir.create_new(self._new_name)
        except OSError as exc:
            return self._rotation_failed(exc)
        try:
            locked = rotation_lock(self._dir.fd) if self.compressor else contextlib.nullcontext()
            with locked:  # a finisher of the last daemon may be placing packed files
                rotated = rotate_into_place(self._dir, self.basename, self.backups, self._new_name)
        except OSError as exc:
            os.close(new_fd)
            with contextlib.suppress(OSError):
                self._dir.unlink(self._new_name)
            return self._rotation_failed(exc)
        self._live.replace_with(new_fd)
        self._rotations += 1
        if self._rotation_failing:
            self._rotation_failing = False
            self._own.append(("log_rotation_resumed", {"failures": self._rotation_failures}))
        if rotated.newest is not None and self.compressor is not None:
            self.compressor.submit_name(self._dir.fd, rotated.newest)
        return True

    def _rotation_failed(self, exc: OSError) -> bool:
        self._rotation_failures += 1
        self._rotate_retry_at = time.monotonic() + ROTATE_RETRY_S
        self._live.last_error = f"rotation: {error_text(exc)}"
        if not self._rotation_failing:  # one record per streak, not one per retry
            self._rotation_failing = True
            fields = {"error": self._live.last_error, "size": self._live.size}
            self._own.append(("log_rotation_failed", {**fields, "retry_s": ROTATE_RETRY_S}))
        return False

    def _record_self(self, event: str, fields: dict[str, Any]) -> bool:
        """A record of the writer's own (its drops, its rotations), into the live file."""
        ts = utc_timestamp(self._clock())
        data = encode_event(self.last_run, event, fields, ts, self.next_seq)
        if not self._live.append(data):
            return False
        self.next_seq += 1
        self._records_written += 1
        self._bytes_written += len(data)
        return True

    # -- lifecycle ----------------------------------------------------------------------

    def stats(self) -> WriterStats:
        """A snapshot of the counters."""
        with self._lock:
            return WriterStats(
                records_written=self._records_written,
                bytes_written=self._bytes_written,
                records_dropped=self._drops.records,
                bytes_dropped=self._drops.nbytes,
                write_errors=self._live.write_errors,
                rotations=self._rotations,
                last_error=self._drops.error or self._live.last_error,
                rotation_failures=self._rotation_failures,
            )

    def _plain_rotated(self, dir_fd: int | None = None) -> list[str]:  # in the held directory
        return [p.name for p in plain_rotated(dir_fd or self._dir.fd, self.basename, self.backups)]

    def close(self, compress_wait_s: float = EXIT_WAIT_S) -> None:
        """Close the live file (idempotent); wait at most ``compress_wait_s`` for the
        compression helper, then hand what is still plain to a finisher (compress.py)."""
        with self._lock:
            self._live.close()
        if self.compressor is not None:
            self.compressor.close(compress_wait_s, basename=self.basename, backups=self.backups)
            self.finisher = self.compressor.finisher
            self.compressor = None

    def __enter__(self) -> RotatingLogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
