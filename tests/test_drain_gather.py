"""The drain's gather (issue 53): after a read, the next waits a millisecond when the read was
small or left a little (not nothing) in the pipe, so a job printing line by line is framed in a
few large frames, not a frame per line and not a large frame followed by a sliver of what was
printed while it was framed."""

from __future__ import annotations

import os

import pytest

from dflashd.logs.drain import (
    PIPE_BYTES,
    SMALL_READ_BYTES,
    PipeDrain,
    grow_pipe,
    pipe_size,
    should_gather,
)
from dflashd.logs.framer import Frame


def test_a_small_read_waits_without_asking_the_pipe() -> None:
    def never_asked() -> int:
        raise AssertionError("the pipe's fill was asked after a small read")

    assert should_gather(SMALL_READ_BYTES - 1, never_asked)


def test_a_large_read_waits_only_when_it_left_a_little_in_the_pipe() -> None:
    assert should_gather(256 * 1024, lambda: 1)
    assert should_gather(256 * 1024, lambda: SMALL_READ_BYTES - 1)
    assert not should_gather(256 * 1024, lambda: SMALL_READ_BYTES)  # a flood: read on at once
    # an emptied pipe is a pause: poll waits for the next write, a burst is read as it comes
    assert not should_gather(256 * 1024, lambda: 0)


def test_a_line_printed_while_a_large_frame_is_handed_on_is_framed_with_the_next() -> None:
    read_fd, write_fd = os.pipe()
    grow_pipe(read_fd)
    if pipe_size(read_fd) < PIPE_BYTES:
        os.close(read_fd)
        os.close(write_fd)
        pytest.skip("Linux refused a 1 MiB pipe here: the drain does not gather on a small one")
    line = b"step 1 loss 2.5 " + b"x" * 83 + b"\n"  # 100 bytes
    os.write(write_fd, line * 655)  # 65,500 bytes: one large read
    frames: list[int] = []
    waits: list[float] = []

    class Recorder:
        def submit_frame(self, run: int, src: str, frame: Frame) -> None:
            frames.append(frame.nbytes)
            if len(frames) == 1:
                os.write(write_fd, line)  # printed while the large frame was handed on

    def wait(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 1:
            os.write(write_fd, line)  # printed during the gather's wait
        else:
            os.close(write_fd)

    drain = PipeDrain(read_fd, run=1, src="stdout", sink=Recorder(), sleep=wait)
    assert drain.wait_eof(10)
    # The line printed meanwhile was not read at once as a frame of its own (65,500, 100, 100):
    # the drain waited, and it came with the next one.
    assert frames == [65_500, 200]
    assert drain.line_count == 657
