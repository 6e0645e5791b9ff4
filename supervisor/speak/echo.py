"""The job's output on dflashd's own stdout (``start --foreground``), as honcho and compose show it.

``r3 out | step 120 loss 2.31`` per line (``--raw``: the bare line), so a terminal, or the
journal under systemd, shows the training as it happens.  The echo must never slow the
child: the drain threads hand frames to a bounded queue and return at once; a writer
thread prints them.  When the terminal (or the journal) cannot keep up, whole frames are
dropped and counted, and a line says how many, instead of back-pressure on the job.

Where the log path's C loops were built, that thread is C's (``CODEC.echo_writer``): it
prefixes and writes without ever taking the GIL, so a flood's echo no longer waits on (and
holds up) the drain and the log writer for it, frame by frame (issue 53, 2-core box: the job's
block writes 6-8 % faster, its line writes ~19 %, and the echo drops fewer lines; see
docs/measurements.md).  Else it is the Python thread below, which does the same.
"""

from __future__ import annotations

import os
import queue
import re
import threading
from typing import BinaryIO, Final

from dflashd.logs.framer import Frame
from dflashd.logs.linecodec import CODEC, EchoWriter, EchoWriterMaker

MAX_QUEUED_FRAMES: Final = 256
# ...and bytes: a flood's frames are up to 512 KiB each, and a terminal slower than the job held up
# to 64 MiB of them (issue 53: the daemon's memory stays bounded whatever the job prints)
MAX_QUEUED_BYTES: Final = 2 * 1024 * 1024
NOTE_HEAD: Final = b"dflashd: "  # then the count, then:
NOTE_TAIL: Final = b" lines not echoed (the terminal was slower than the job; all are in the log)\n"
# C0 (tab aside), DEL and C1 (0x9b is a one-character CSI to some terminals)
_CONTROL: Final = {c: f"\\x{c:02x}" for c in (*range(9), *range(10, 32), *range(127, 160))}
_CONTROL_RE: Final = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")
_LINES_KEPT: Final = {c: v for c, v in _CONTROL.items() if c != 10}
_CONTROL_BUT_LINES_RE: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def escape_controls(text: str) -> str:
    """Control characters shown escaped (``\\x1b``), as journalctl does; tabs kept."""
    if _CONTROL_RE.search(text) is None:
        return text
    return text.translate(_CONTROL)


def escape_controls_but_lines(text: str) -> str:
    """The same for a document of lines (a report): its newlines kept."""
    if _CONTROL_BUT_LINES_RE.search(text) is None:
        return text
    return text.translate(_LINES_KEPT)


def escaped_values(value: object) -> object:
    """A decoded JSON value with every string in it escaped (keys too): what a person's
    terminal is shown of state another user or the job could shape."""
    if isinstance(value, str):
        return escape_controls(value)
    if isinstance(value, dict):
        return {escape_controls(str(k)): escaped_values(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [escaped_values(v) for v in value]
    return value


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class EchoThread:
    """The echo's writer where the C loops were not built: ``_lines.EchoWriter``'s twin
    (logs/_lines.c says what each method does), a Python thread.  The same bounds, drops and
    note; it prefixes a scanned frame's lines in its own thread (``CODEC.prefix``)."""

    def __init__(
        self, fd: int, max_bytes: int, max_items: int, note_head: bytes, note_tail: bytes
    ) -> None:
        self._fd, self._max_bytes, self._note = fd, max_bytes, (note_head, note_tail)
        self._queue: queue.Queue[tuple[bytes, int, bytes] | None] = queue.Queue(max_items)
        self.dropped = 0
        self.queued_bytes = 0  # offered, not yet taken by the thread
        self._said = 0
        self._closing = False
        self._gone = False  # the stream cannot be written (a closed terminal)
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="dflashd-echo", daemon=True)
        self._thread.start()

    def offer(self, data: bytes, count: int, head: bytes, lines: int, /) -> bool:
        """From a drain thread: queue ``data``, or count its ``lines`` dropped; never waits."""
        with self._lock:
            full = self.queued_bytes and self.queued_bytes + len(data) > self._max_bytes
            if self._closing or self._gone or full:
                self.dropped += lines
                return False
            self.queued_bytes += len(data)
        try:
            self._queue.put_nowait((data, count, head))
        except queue.Full:
            with self._lock:
                self.queued_bytes -= len(data)
                self.dropped += lines
            return False
        return True

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            data, count, head = item
            with self._lock:
                self.queued_bytes -= len(data)
                lost, self._said = self.dropped - self._said, self.dropped
            if self._gone:
                continue
            try:
                if lost:
                    _write_all(self._fd, self._note[0] + str(lost).encode() + self._note[1])
                _write_all(self._fd, CODEC.prefix(data, count, head) if count else data)
            except OSError:  # stdout gone (a closed terminal): the log has everything
                self._gone = True

    def close(self, timeout_s: float, /) -> bool:
        """What is queued is written (bounded by ``timeout_s``), then the thread ends."""
        with self._lock:
            self._closing = True
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            return False
        self._thread.join(timeout_s)
        return not self._thread.is_alive()


class Echo:
    """Formats the job's frames for a stream and hands them to its writer thread (C's
    ``EchoWriter`` where built, else :class:`EchoThread`); drops rather than blocks."""

    def __init__(
        self, stream: BinaryIO, *, raw: bool = False, color: bool = False, redraw: bool = False
    ) -> None:
        self._raw = raw
        self._redraw = redraw or raw  # keep the job's \r (a terminal; --raw always)
        self._color = color
        self._heads: dict[tuple[int, str], bytes] = {}
        writer: EchoWriterMaker = CODEC.echo_writer or EchoThread
        self._writer: EchoWriter = writer(
            stream.fileno(), MAX_QUEUED_BYTES, MAX_QUEUED_FRAMES, NOTE_HEAD, NOTE_TAIL
        )

    @property
    def dropped_lines(self) -> int:
        """Lines offered and not echoed (the terminal was slower than the job, or gone)."""
        return self._writer.dropped

    @property
    def _queued_bytes(self) -> int:
        return self._writer.queued_bytes

    def offer(self, run_no: int, src: str, frame: Frame) -> None:
        """From a drain thread: queue the frame, or count it dropped; never waits."""
        if frame.text is not None:  # a scanned frame: prefixed by the writer's thread
            head = b"" if self._raw else self._head(run_no, src)
            self._writer.offer(frame.text, len(frame), head, len(frame))
            return
        try:  # bars, control characters, partial lines: formatted here, written as they are
            formatted = self._format(run_no, src, frame)
        except Exception:  # never the drain's end: this frame is not echoed (the log has it)
            formatted = b""
        self._writer.offer(formatted, 0, b"", len(frame))

    def _head(self, run_no: int, src: str) -> bytes:
        head = self._heads.get((run_no, src))
        if head is None:
            head = self._heads[(run_no, src)] = self._prefix(run_no, src).encode()
        return head

    def _prefix(self, run_no: int, src: str) -> str:
        tag = "err" if src == "stderr" else "out"
        if not self._color:
            return f"r{run_no} {tag} | "
        colour = "31" if src == "stderr" else "36"
        return f"\x1b[2mr{run_no}\x1b[0m \x1b[{colour}m{tag}\x1b[0m | "

    def _format(self, run_no: int, src: str, frame: Frame) -> bytes:
        """A frame the framer did not scan (control characters, ``\r``, partial lines)."""
        ends = self._ends(frame)
        pairs = zip(frame.lines, ends, strict=True)
        if self._raw:
            return "".join(f"{line}{end}" for line, end in pairs).encode("utf-8", "replace")
        prefix = self._prefix(run_no, src)
        text = "".join(f"{prefix}{escape_controls(line)}{end}" for line, end in pairs)
        return text.encode("utf-8", "replace")

    def _ends(self, frame: Frame) -> list[str]:
        """Each line's terminator as the job wrote it: a bar's ``\r`` redraws in place, as it
        does under ``tee`` (kept with --raw, and on a terminal; the journal gets lines)."""
        if frame.flags is None or not self._redraw:
            return ["\n"] * len(frame.lines)
        return ["\n" if partial or eol is None else eol for partial, eol in frame.flags]

    def close(self, timeout_s: float = 2.0) -> None:
        """Print what is queued (bounded), then stop."""
        self._writer.close(timeout_s)
