"""The echo's writer thread in C (``CODEC.echo_writer``, issue 53): frames offered by the drains
(holding the GIL) are prefixed and written by a thread that never takes it.  It must write
exactly what the Python echo wrote, in the order offered, keep the same bounds and drops, say
the drops before the next frame, stop quietly when the stream is gone, and never let ``close``
wait past its timeout on a stalled terminal.  Real pipes, real files."""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import pytest

from dflashd.logs import linecodec
from dflashd.logs.framer import Frame, LineFramer
from dflashd.supervisor.speak.echo import (
    MAX_QUEUED_BYTES,
    MAX_QUEUED_FRAMES,
    NOTE_HEAD,
    NOTE_TAIL,
    Echo,
)
from tests.helpers import read_to_end

_lines = pytest.importorskip("dflashd.logs._lines", reason="the C loops were not built here")


def scanned(lines: list[bytes]) -> Frame:
    """A frame the way the drain's C read makes one: scanned, its text JSON-safe."""
    frame = LineFramer(1 << 20).feed(b"\n".join(lines) + b"\n")
    assert frame is not None and frame.text is not None
    return frame


def writer_on(fd: int) -> linecodec.EchoWriter:
    return _lines.EchoWriter(fd, MAX_QUEUED_BYTES, MAX_QUEUED_FRAMES, NOTE_HEAD, NOTE_TAIL)


def test_it_writes_what_prefix_makes_raw_lines_and_formatted_bytes_in_order() -> None:
    lines = [b"step %d loss %.3f " % (i, i / 7) + b"x" * (i % 90) for i in range(500)]
    data = b"\n".join(lines)
    read_fd, write_fd = os.pipe()
    got = bytearray()
    reader = threading.Thread(target=lambda: got.extend(read_to_end(read_fd)))
    reader.start()
    writer = writer_on(write_fd)
    assert writer.offer(data, 500, b"r1 out | ", 500)
    assert writer.offer(b"r1 err | \\x1b[31mred\n", 0, b"", 1)  # formatted in Python
    assert writer.offer(data, 500, b"", 500)  # --raw: the bare lines
    assert writer.close(10)
    os.close(write_fd)
    reader.join(10)
    expected = linecodec.prefix_python(data, 500, b"r1 out | ") + b"r1 err | \\x1b[31mred\n"
    assert bytes(got) == expected + data + b"\n"
    assert writer.dropped == 0 and writer.queued_bytes == 0


def test_a_stream_gone_drops_and_counts_and_never_raises() -> None:
    read_fd, write_fd = os.pipe()
    os.close(read_fd)  # every write is EPIPE (Python ignores SIGPIPE)
    writer = writer_on(write_fd)
    data = b"\n".join([b"step 1 loss 2.0"] * 100)
    writer.offer(data, 100, b"r1 out | ", 100)  # written and failed, or dropped: never raised
    assert writer.close(10)
    assert not writer.offer(data, 100, b"r1 out | ", 100)  # closed: dropped, counted
    assert writer.dropped >= 100
    os.close(write_fd)


def test_a_stalled_terminal_keeps_the_bound_says_the_drops_and_close_keeps_its_timeout() -> None:
    read_fd, write_fd = os.pipe()  # nobody reads yet: the thread's write blocks once it is full
    line = b"step 7 loss 2.0 " + b"x" * 100
    frame = scanned([line] * (256 * 1024 // (len(line) + 1)))
    assert frame.text is not None
    writer = writer_on(write_fd)
    queued = []
    for _ in range(64):  # 16 MiB offered to a terminal that takes none of it
        writer.offer(frame.text, len(frame), b"r1 out | ", len(frame))
        queued.append(writer.queued_bytes)
    assert max(queued) <= MAX_QUEUED_BYTES
    assert writer.dropped >= (64 - MAX_QUEUED_BYTES // len(frame.text) - 1) * len(frame)
    assert not writer.close(0.2)  # still writing into the full pipe: close does not wait on it
    said = bytearray()
    reader = threading.Thread(target=lambda: said.extend(read_to_end(read_fd)))
    reader.start()
    assert writer.close(30)  # now read: what was queued is written, and the thread ends
    os.close(write_fd)
    reader.join(30)
    notes = re.findall(re.escape(NOTE_HEAD) + rb"(\d+)" + re.escape(NOTE_TAIL), bytes(said))
    assert sum(map(int, notes)) == writer.dropped  # each drop said, before the next frame
    assert said.endswith(b"r1 out | " + line + b"\n")


@pytest.mark.parametrize("implementation", ["c", "python"])
def test_the_echo_prints_flood_frames_and_formatted_ones_alike(
    implementation: str, tmp_path: Path
) -> None:
    previous = linecodec.use(implementation)
    try:
        out = tmp_path / "echo.txt"
        with open(out, "wb") as stream:
            echo = Echo(stream)
            echo.offer(1, "stdout", scanned([b"step 1 loss 2.0", b"step 2 loss 1.9"]))
            bar = LineFramer().feed(b"\x1b[1mbold\x1b[0m\n")
            assert bar is not None and bar.text is None
            echo.offer(2, "stderr", bar)
            echo.close()
            assert echo.dropped_lines == 0
    finally:
        linecodec.use(previous.implementation)
    assert out.read_bytes() == (
        b"r1 out | step 1 loss 2.0\nr1 out | step 2 loss 1.9\nr2 err | \\x1b[1mbold\\x1b[0m\n"
    )


def test_an_uninitialised_writer_refuses_offers_and_closes_at_once() -> None:
    bare = _lines.EchoWriter.__new__(_lines.EchoWriter)
    with pytest.raises(ValueError):
        bare.offer(b"x", 1, b"", 1)
    assert bare.close(0.1) and bare.dropped == 0
