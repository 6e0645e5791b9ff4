"""Draining one child pipe into a log sink, on a thread of its own.

A :class:`PipeDrain` reads until end of file (which may come long after the child died,
if a grandchild holds the pipe), frames the bytes and hands them to the sink.  It never
waits on anything but ``read(2)`` and the sink's back-pressure, so a child never freezes
inside ``print()`` because the supervisor is busy elsewhere.

The supervisor can ask it, once the child is dead, to catch up with everything already
in the pipe (:meth:`PipeDrain.catch_up`), so the ``exit`` record follows the child's
last words instead of racing them.
"""

from __future__ import annotations

import fcntl
import os
import select
import termios
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Final, Protocol

from dflashd.logs.framer import DEFAULT_MAX_LINE_BYTES, Frame, LineFramer
from dflashd.logs.linecodec import CODEC

# A flood's frames: a frame's Python on the drain's thread and the writer's costs the same
# whatever its size, so half the pipe a read (was 256 KiB: that Python was 17 % of a 2-core
# box's CPU in a block flood, 12 % at 512 KiB; a read of the whole pipe raised the flood's peak
# RSS from 36 to 48 MiB for less; issue 53, docs/measurements.md).
READ_BYTES: Final = 512 * 1024
# After a read this small, or one that left less than this (but something) in the pipe, the
# next waits this long: a job printing line by line wakes a drain that reads at once for every
# line (each write(2) then pays the reader's wake-up, and every line is a frame of its own); a
# millisecond lets them gather in the 1 MiB pipe, which holds far more than any job prints in
# one (the child is never blocked: issue 53).  The pipe's fill is asked after a large read too:
# reading again at once took the few KiB printed meanwhile, and half a line flood's frames were
# such slivers, each a hand-off to the writer and the echo.  A block flood refills the pipe
# faster than a read is framed, so it never waits; an emptied pipe is a pause, and the drain
# waits for the next write (without poll(2): :meth:`PipeDrain._wait_readable`).
SMALL_READ_BYTES: Final = 16 * 1024
GATHER_S: Final = 0.001
PIPE_BYTES: Final = 1 << 20
F_SETPIPE_SZ: Final = 1031
F_GETPIPE_SZ: Final = 1032

LinesCallback = Callable[[str, Frame], None]


def grow_pipe(fd: int, size: int = PIPE_BYTES) -> None:
    """Ask Linux for a larger pipe buffer (absorbs bursts); silently keep the default if refused."""
    try:
        fcntl.fcntl(fd, F_SETPIPE_SZ, size)
    except OSError:
        pass


def pipe_size(fd: int) -> int:
    """The pipe's buffer in bytes (0: not a pipe, or unknown)."""
    try:
        return int(fcntl.fcntl(fd, F_GETPIPE_SZ))
    except OSError:
        return 0


def pending_bytes(fd: int) -> int:
    """Bytes sitting unread in a pipe (FIONREAD; in C, holding the GIL: ``CODEC.pending``)."""
    pending = CODEC.pending
    if pending is not None:
        return pending(fd)
    buf = bytearray(4)
    try:
        fcntl.ioctl(fd, termios.FIONREAD, buf)
    except OSError:
        return 0
    return int.from_bytes(buf, "little")


def should_gather(nread: int, left_in_pipe: Callable[[], int]) -> bool:
    """Wait ``GATHER_S`` before the next read: the last one was small, or it left a little in
    the pipe (asked only after a large read: a syscall).  A large read that emptied the pipe
    does not wait: the writer paused, and the next read waits for its next write,
    so a burst after the pause is read as it comes instead of filling the pipe meanwhile."""
    if nread < SMALL_READ_BYTES:
        return True
    left = left_in_pipe()
    return 0 < left < SMALL_READ_BYTES


def _bell() -> tuple[int, int] | None:
    """The drain's private bell pipe (read end non-blocking), or None where the process has no
    descriptor to spare: the drain then waits with poll."""
    try:
        bell_r, bell_w = os.pipe()
    except OSError:
        return None
    os.set_blocking(bell_r, False)
    return bell_r, bell_w


class LineTail:
    """The last lines for the exit record, as a reader would want them: whitespace-only lines
    (a bar's clears) left out, and a ``\r``-redrawn line replaced by what redrew it, so a
    progress bar shows once, in its last state, and the traceback stays visible.  Each frame
    gives its last ``n`` lines.  The log itself keeps every line."""

    def __init__(self, n: int) -> None:
        self.lines: deque[str] = deque(maxlen=n)
        self._redrawn = False  # the last line kept ended in \r (a bar being redrawn)

    def add(self, frame: Frame) -> None:
        texts = frame.last_lines(self.lines.maxlen or 0)
        if frame.flags is None:  # every line ended by "\n" (a flood's frames): added at once
            kept = [text for text in texts if text.strip()]
            if kept:
                if self._redrawn and self.lines:
                    self.lines.pop()  # the line before ended in \r: the first is its redraw
                self.lines.extend(kept)
                self._redrawn = False
            return
        flags = frame.flags[-len(texts) :] if texts else []
        for text, (_, eol) in zip(texts, flags, strict=True):
            if not text.strip():
                continue
            if self._redrawn and self.lines:
                self.lines.pop()  # the previous line ended in \r: this one is its redraw
            self.lines.append(text)
            self._redrawn = eol == "\r"


class FrameSink(Protocol):
    """Where a drain hands its frames (the run log's :class:`~dflashd.logs.sink.LogSink`)."""

    def submit_frame(self, run: int, src: str, frame: Frame) -> object:
        """Take one frame of ``src`` output of ``run``; may push back, never raises."""
        ...


class PipeDrain:
    """Reads one pipe of one run to its end; tracks the last lines for the ``exit`` record."""

    def __init__(
        self,
        fd: int,
        *,
        run: int,
        src: str,
        sink: FrameSink,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        tail_lines: int = 20,
        on_lines: LinesCallback | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.fd = fd
        self._sleep = sleep  # the gather's wait (tests put lines in the pipe meanwhile)
        self.run = run
        self.src = src
        self._sink = sink
        self._framer = LineFramer(max_line_bytes)
        self._framer_lock = threading.Lock()
        self._on_lines = on_lines
        self._cond = threading.Condition()
        # Reads happen under this lock on a non-blocking fd (once a wait said readable), so
        # catch_up() sees "bytes taken from the pipe" and "bytes still in it" at one instant.
        self._read_lock = threading.Lock()
        os.set_blocking(fd, False)
        self._wait_bytes = CODEC.wait_bytes
        self._bell = _bell() if self._wait_bytes is not None else None
        self._poll: select.poll | None = None  # the wait where the bell cannot ring
        self.read_bytes = 0
        self.consumed_bytes = 0
        self.line_count = 0
        self.eof = False
        self.error: str | None = None
        self._tail = LineTail(tail_lines)
        self.tail = self._tail.lines
        # gather small reads only where the pipe holds a burst (Linux may refuse to grow it)
        self._gather_s = GATHER_S if pipe_size(fd) >= PIPE_BYTES else 0.0
        self._thread = threading.Thread(
            target=self._run, name=f"dflashd-drain-{src}-{run}", daemon=True
        )
        self._thread.start()

    def _emit(self, frame: Frame | None) -> None:
        if frame is None or not len(frame):
            return
        self.line_count += len(frame)
        self._tail.add(frame)
        self._sink.submit_frame(self.run, self.src, frame)
        if self._on_lines is not None:
            self._on_lines(self.src, frame)

    def _run(self) -> None:
        try:
            while True:
                try:
                    nread = self._read_and_frame()
                except BlockingIOError:  # nothing yet: wait (a flood never gets here)
                    self._wait_readable()
                    continue
                except InterruptedError:
                    continue
                except OSError as exc:
                    self.error = exc.strerror
                    nread = 0
                if not nread:
                    break
                with self._cond:
                    self.consumed_bytes += nread
                    self._cond.notify_all()
                if self._gather_s and should_gather(nread, lambda: pending_bytes(self.fd)):
                    self._sleep(self._gather_s)
            with self._framer_lock:
                self._emit(self._framer.flush())
        finally:
            os.close(self.fd)
            self._close_bell()
            with self._cond:
                self.eof = True
                self._cond.notify_all()

    def _read_and_frame(self) -> int:
        """One read, framed and handed on; the bytes read (0: end of file).  In C, the read and
        the scan are one call that leaves the GIL once, reading in behind the held-back bytes;
        the framer's lock is held across it, so :meth:`catch_up`'s flush of those bytes can
        never fall between the read and the frame (they would be recorded twice)."""
        read_lines = CODEC.read_lines
        with self._framer_lock:
            if read_lines is None:
                with self._read_lock:
                    chunk = os.read(self.fd, READ_BYTES)
                    self.read_bytes += len(chunk)
                if chunk:
                    self._emit(self._framer.feed(chunk))
                return len(chunk)
            framer = self._framer
            with self._read_lock:
                text, rest, nread, count = read_lines(
                    self.fd, framer.held, READ_BYTES, framer.max_line_bytes
                )
                self.read_bytes += nread
            if nread:
                self._emit(framer.take(text, rest, count))
            return nread

    def _wait_readable(self) -> None:
        """Until the emptied pipe has bytes or no writer.  Not with ``poll(2)`` where it can be
        helped: Linux then wakes the pipe's readers' queue on every later write(2) of the job's,
        ~10 % of a line-by-line job's own rate for the rest of the run (issue 53,
        ``tests/perf/poll_cost.py``).  A blocking ``tee(2)`` into the drain's private bell pipe
        waits on the same queue and takes nothing from the pipe (``_lines.c``); poll where C
        was not built, the fd is no pipe or the host refuses tee."""
        if self._bell is not None and self._wait_bytes is not None:
            try:
                self._wait_bytes(self.fd, *self._bell)
                return
            except OSError:
                self._close_bell()
        if self._poll is None:
            self._poll = select.poll()
            self._poll.register(self.fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        try:
            self._poll.poll()
        except InterruptedError:
            pass

    def _close_bell(self) -> None:
        bell, self._bell = self._bell, None
        for fd in bell or ():
            os.close(fd)

    def catch_up(self, timeout_s: float) -> bool:
        """Wait until everything in the pipe right now is framed (or EOF); then cut a pending partial.

        Called after the child died: whatever it wrote is already in the pipe, so this is
        quick, and a grandchild that keeps writing does not hold it up.
        """
        with self._cond:
            if self.eof:
                return True
            with self._read_lock:
                target = self.read_bytes + pending_bytes(self.fd)
            deadline = time.monotonic() + timeout_s
            while not self.eof and self.consumed_bytes < target:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    # Not caught up (the sink is pushing back): leave the pending partial line
                    # alone, it may still be completed by bytes in flight.
                    return False
                self._cond.wait(remaining)
            if self.eof:
                return True
        # The child's unterminated last line: a death is a boundary, record it now as partial.
        with self._framer_lock:
            self._emit(self._framer.flush())
        return True

    def wait_eof(self, timeout_s: float) -> bool:
        """Wait for the end of the stream (every writer gone)."""
        with self._cond:
            return self._cond.wait_for(lambda: self.eof, timeout_s)
