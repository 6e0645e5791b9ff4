"""The echo of the job's output (``start --foreground``): formatted in one pass, and bounded in
memory when the terminal is slower than the job (frames dropped and counted, never queued
without end).  Each test runs with the C writer thread and with the Python one."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest

from dflashd.logs import linecodec
from dflashd.logs.framer import LineFramer
from dflashd.supervisor.speak.echo import MAX_QUEUED_BYTES, Echo
from tests.helpers import read_to_end


@pytest.fixture(autouse=True, params=["c", "python"])
def implementation(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "c":
        pytest.importorskip("dflashd.logs._lines", reason="the C loops were not built here")
    previous = linecodec.use(request.param)
    yield request.param
    linecodec.use(previous.implementation)


def test_lines_are_prefixed_with_the_run_and_stream() -> None:
    read_fd, write_fd = os.pipe()
    with os.fdopen(write_fd, "wb") as stream:
        echo = Echo(stream)
        frame = LineFramer().feed(b"step 1 loss 2.0\nstep 2 loss 1.9\n")
        assert frame is not None
        echo.offer(3, "stderr", frame)
        echo.close()
    with os.fdopen(read_fd, "rb") as got:
        assert got.read() == b"r3 err | step 1 loss 2.0\nr3 err | step 2 loss 1.9\n"


def test_a_stalled_terminal_holds_at_most_its_bound_and_the_drops_are_said() -> None:
    read_fd, write_fd = os.pipe()  # nobody reads: the echo's write blocks once the pipe is full
    line = b"step 7 loss 2.0 " + b"x" * 100 + b"\n"
    frame = LineFramer().feed(line * (256 * 1024 // len(line)))
    assert frame is not None
    stream = os.fdopen(write_fd, "wb")
    echo = Echo(stream)
    queued = []
    for _ in range(64):  # 16 MiB offered to a terminal that takes none of it
        echo.offer(1, "stdout", frame)
        queued.append(echo._queued_bytes)
    assert max(queued) <= MAX_QUEUED_BYTES
    assert echo.dropped_lines >= (64 - MAX_QUEUED_BYTES // frame.nbytes - 1) * len(frame)
    said = bytearray()
    reader = threading.Thread(target=lambda: said.extend(read_to_end(read_fd)))
    reader.start()
    echo.close(timeout_s=30)  # what was queued is written, the drops said before it
    stream.close()
    reader.join(30)
    assert b"lines not echoed (the terminal was slower than the job; all are in the log)" in said
    assert said.endswith(b"r1 out | " + line)
