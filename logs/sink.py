"""A non-blocking front for :class:`RotatingLogWriter`: a bounded queue and one writer thread.

Pipe readers hand frames to :meth:`LogSink.submit_frame`, which never raises.  While the
writer thread makes progress, a full queue makes the submitter wait (back-pressure: a
child that floods faster than we can write is slowed, like ``tee``; nothing is lost).
When the writer has been stuck inside one write for ``stall_s`` (a hung NFS mount, a
dying disk), frames are dropped and counted instead, so the child never freezes inside
``print()``; a ``log_dropped`` record says so once writing works again.

The thread never dies: whatever a write raises (an OSError the writer did not expect, an
encoder error) is counted as that batch's drop and the loop goes on.  A supervisor record
the disk refused (``spawn``, ``exit``: what says what happened) is not dropped but kept and
written again every ``RETRY_S`` until the disk takes it (at most ``MAX_RETRIED`` kept; past
that the oldest is dropped and counted).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from dflashd.logs.framer import Frame
from dflashd.logs.heap import keep_freed_buffers, release_free_memory
from dflashd.logs.writer import RotatingLogWriter, WriterStats

# What a flood holds in memory (issue 53): the frames waiting here (the line watcher holds the
# newest ones too, the supervisor's watch/linewatch.py), and each write's records, made from
# ``_COALESCE_BYTES`` of frames at once.  8 MiB and 1 MiB held a block flood's peak at 45 MiB
# on the 2-core box and 53-55 on the 16-core host; 4 MiB and 256 KiB at 38 and 43-46, at the
# same rate within the 2-core box's noise (the host: about 8 % lower in the default variant's
# median, a trade stated in docs/measurements.md).  4 MiB is 8 ms of a 500 MiB/s flood, and a
# disk that takes longer is the stall below, not the queue.
DEFAULT_MAX_QUEUE_BYTES: Final = 4 * 1024 * 1024
DEFAULT_STALL_S: Final = 2.0
# A write's frames: a flood's read's worth (logs/drain.py), or ~100 of a line flood's small ones.
_COALESCE_BYTES: Final = 512 * 1024
RETRY_S: Final = 0.5
MAX_RETRIED: Final = 10_000
# After this much output, once the queue is empty (or, after a burst, has stayed empty this
# long) and at most this often, the C allocator's free memory goes back to the system: the
# buffers a chatty job's frames passed through stay with the daemon otherwise (a job at
# ~1,700 lines/s: 37 -> 53 MiB in 15 min; trimmed: 37.6); within a burst they are kept for
# reuse (logs/heap.py).
TRIM_AFTER_BYTES: Final = 8 * 1024 * 1024
TRIM_QUIET_S: Final = 1.0
TRIM_EVERY_S: Final = 30.0


@dataclass(frozen=True, slots=True)
class _FrameItem:
    run: int
    src: str
    frame: Frame
    wall_s: float


@dataclass(frozen=True, slots=True)
class _EventItem:
    run: int
    event: str
    fields: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SinkStats:
    """Writer counters plus what the sink itself had to drop while the disk stalled."""

    writer: WriterStats
    queued_bytes: int
    stalled_drops_records: int
    stalled_drops_bytes: int


class LogSink:
    """Owns a writer thread; safe to call from any thread."""

    def __init__(
        self,
        writer: RotatingLogWriter,
        *,
        max_queue_bytes: int = DEFAULT_MAX_QUEUE_BYTES,
        stall_s: float = DEFAULT_STALL_S,
        clock: Callable[[], float] = time.time,
        trim: Callable[[], None] = release_free_memory,
    ) -> None:
        self.writer = writer
        self._clock = clock  # wall time of frames (records' ``ts``); the daemon's injected clock
        self._max_queue_bytes = max_queue_bytes
        self._stall_s = stall_s
        # One lock, three waits, each woken only by what it waits for: the writer for work,
        # a drain for room in the queue, a caller of wait_written for its ticket (one condition
        # for all woke a drain held by the bound at each frame the other stream submitted).
        lock = threading.RLock()
        self._cond = threading.Condition(lock)  # the writer: work to do
        self._room = threading.Condition(lock)
        self._progress = threading.Condition(lock)
        self._queue: deque[_FrameItem | _EventItem] = deque()
        self._queued_bytes = 0
        self._submitted = 0
        self._done = 0
        self._write_started: float | None = None
        self._closing = False
        self._drop_records = 0
        self._drop_bytes = 0
        self._unreported_drop_records = 0
        self._unreported_drop_bytes = 0
        self._retry: deque[_EventItem] = deque()  # refused by the disk, written again later
        self.thread_errors = 0
        self._trim, self._untrimmed, self._trimmed_at = trim, 0, time.monotonic()
        keep_freed_buffers()  # a flood's buffers reused, not mapped afresh (logs/heap.py)
        self._thread = threading.Thread(target=self._run, name="dflashd-log-writer", daemon=True)
        self._thread.start()

    # -- producers ----------------------------------------------------------------------

    def submit_frame(self, run: int, src: str, frame: Frame, wall_s: float | None = None) -> None:
        """Queue one frame; waits only while the writer is making progress."""
        if not len(frame):
            return
        item = _FrameItem(run, src, frame, self._clock() if wall_s is None else wall_s)
        with self._cond:
            while self._queued_bytes >= self._max_queue_bytes and not self._closing:
                started = self._write_started
                if started is not None and time.monotonic() - started > self._stall_s:
                    self._drop_records += len(frame)
                    self._drop_bytes += frame.nbytes
                    self._unreported_drop_records += len(frame)
                    self._unreported_drop_bytes += frame.nbytes
                    return
                self._room.wait(timeout=self._stall_s / 4)
            self._queue.append(item)
            self._queued_bytes += frame.nbytes
            self._submitted += 1
            self._cond.notify()

    def submit_event(self, run: int, event: str, fields: dict[str, Any] | None = None) -> int:
        """Queue one supervisor record (never dropped for space); returns a ticket for :meth:`wait_written`."""
        with self._cond:
            self._queue.append(_EventItem(run, event, dict(fields or {})))
            self._submitted += 1
            ticket = self._submitted
            self._cond.notify()
            return ticket

    def ticket(self) -> int:
        """A ticket covering everything submitted so far."""
        with self._cond:
            return self._submitted

    def wait_written(self, ticket: int, timeout_s: float) -> bool:
        """Block until every item up to ``ticket`` has been handed to the writer (or the timeout)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._done < ticket:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._progress.wait(timeout=remaining)
            return True

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until everything submitted so far is written."""
        return self.wait_written(self.ticket(), timeout_s)

    # -- the writer thread --------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    # a record to write again, or a trim owed once the burst is over
                    timeout = RETRY_S if self._retry else self._trim_in_s()
                    if timeout is None:
                        self._cond.wait()
                        continue
                    self._cond.wait(timeout)
                    break
                if not self._queue and not self._retry and self._closing:
                    return
                batch, self._queue = self._queue, deque()
                count = len(batch)
                self._write_started = time.monotonic()
                drops = (self._unreported_drop_records, self._unreported_drop_bytes)
                self._unreported_drop_records = self._unreported_drop_bytes = 0
            if drops[0]:  # said by the writer's next log_dropped record
                self.writer.note_dropped(drops[0], drops[1], "disk stalled")
            self._write_retried()
            self._write_batch(batch)
            with self._cond:
                self._write_started = None
                self._done += count
                self._progress.notify_all()
                self._room.notify_all()
                give_up = self._closing and not self._queue and bool(self._retry)
                idle = not self._queue
            if idle:  # between a trickle's lines, or woken once a burst has stopped
                self._trim_if_due()
            if give_up:
                self._write_retried()  # one last try; what the disk still refuses is counted
                return

    def _release(self, nbytes: int) -> None:
        """Frames written (or dropped): their bytes leave the queue's bound at once, so a drain
        held by it reads again while the rest of the batch is written (it waited for the
        whole batch, up to the bound, the job's pipe filling meanwhile)."""
        if not nbytes:
            return
        with self._cond:
            self._queued_bytes -= nbytes
            self._room.notify_all()
        self._untrimmed += nbytes

    def _trim_in_s(self) -> float | None:
        """How long the queue must stay empty before the owed trim; None when none is owed."""
        if self._untrimmed < TRIM_AFTER_BYTES:
            return None
        return max(TRIM_QUIET_S, self._trimmed_at + TRIM_EVERY_S - time.monotonic())

    def _trim_if_due(self) -> None:
        """After a burst, once the queue stayed empty: the freed buffers back to the system."""
        now = time.monotonic()
        if self._untrimmed >= TRIM_AFTER_BYTES and now - self._trimmed_at >= TRIM_EVERY_S:
            self._untrimmed, self._trimmed_at = 0, now
            self._trim()

    def _write_batch(self, batch: deque[_FrameItem | _EventItem]) -> None:
        """The batch in order, taken from its front as it is written: consecutive frames go out
        in one write (many small reads in line mode), up to ``_COALESCE_BYTES``, and their
        bytes leave the queue's bound as soon as they are written."""
        chunk: list[_FrameItem] = []
        chunk_bytes = 0
        try:
            while batch:
                item = batch.popleft()
                if isinstance(item, _FrameItem):
                    chunk.append(item)
                    chunk_bytes += item.frame.nbytes
                    if chunk_bytes < _COALESCE_BYTES:
                        continue
                if chunk:
                    self._release(self._write_frames(chunk))
                    chunk, chunk_bytes = [], 0
                if isinstance(item, _EventItem):
                    self._write_started = time.monotonic()
                    self._write_event(item)
            if chunk:
                self._release(self._write_frames(chunk))
        except Exception as exc:  # never lose the thread: the unwritten rest is dropped, counted
            self._release(self._lost([*chunk, *batch], exc))

    def _write_event(self, item: _EventItem) -> None:
        # records keep their order: behind the ones waiting, if any
        if self._retry or not self._write_one(item):
            self._keep(item)

    def _write_one(self, item: _EventItem) -> bool:
        """Done with the record (written, or lost to an error: counted); False: the disk
        refused it and it is to be written again."""
        try:
            return (
                self.writer.write_event(item.run, item.event, item.fields, count_drop=False)
                is not None
            )
        except Exception as exc:
            self._lost_one(item, exc)
            return True

    def _keep(self, item: _EventItem) -> None:
        self._retry.append(item)
        if len(self._retry) > MAX_RETRIED:
            self._lost_one(self._retry.popleft(), None)

    def _write_retried(self) -> None:
        while self._retry and self._write_one(self._retry[0]):
            self._retry.popleft()  # the rest waits while the disk still refuses

    def _lost_one(self, item: _EventItem, exc: Exception | None) -> None:
        why = "kept too long unwritten" if exc is None else f"{type(exc).__name__}: {exc}"
        self.writer.count_dropped(1, 0, f"{item.event} record: {why}"[:300])

    def _lost(self, batch: list[_FrameItem | _EventItem], exc: Exception) -> int:
        """The batch's unwritten rest counted as dropped; its frames' bytes."""
        self.thread_errors += 1
        records = sum(len(i.frame) if isinstance(i, _FrameItem) else 1 for i in batch)
        nbytes = sum(i.frame.nbytes for i in batch if isinstance(i, _FrameItem))
        self.writer.count_dropped(records, nbytes, f"{type(exc).__name__}: {exc}"[:300])
        return nbytes

    def _write_frames(self, chunk: list[_FrameItem]) -> int:
        """One append of the chunk's frames; their bytes (written, or dropped and counted)."""
        # The stall clock runs per write, not per batch: a big batch on a slow but working disk is no stall.
        self._write_started = time.monotonic()
        frames = [(item.run, item.src, item.frame, item.wall_s) for item in chunk]
        nbytes = sum(item.frame.nbytes for item in chunk)
        try:
            self.writer.write_frames(frames)
        except Exception as exc:  # nothing of these reached the disk (encoded before written)
            self.thread_errors += 1
            records = sum(len(item.frame) for item in chunk)
            self.writer.count_dropped(records, nbytes, f"{type(exc).__name__}: {exc}"[:300])
        return nbytes

    def stats(self) -> SinkStats:
        """Counters for status and metrics."""
        with self._cond:
            queued, records, nbytes = self._queued_bytes, self._drop_records, self._drop_bytes
        return SinkStats(self.writer.stats(), queued, records, nbytes)

    def close(self, timeout_s: float = 5.0) -> None:
        """Write what is queued (up to the timeout), stop the thread and close the file."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            self._room.notify_all()
            self._progress.notify_all()
        self._thread.join(timeout_s)
        for item in self._retry:  # the disk never took them: counted, in the stats
            self._lost_one(item, None)
        self._retry.clear()
        if not self._thread.is_alive():
            self.writer.close()
