"""The drain's wait on an emptied pipe without poll(2) (issue 53): Linux marks a pipe that was
ever polled and from then on wakes its readers' queue on every write(2), a tenth of a job's
line rate (tests/perf/poll_cost.py).  The drain waits with a blocking tee(2) of one byte into a
private bell pipe instead (``CODEC.wait_bytes``), which takes nothing from the pipe, and falls
back to poll where tee cannot be used (no pipe, no C)."""

from __future__ import annotations

import fcntl
import os
import select
import socket
import threading
from collections.abc import Iterator

import pytest

from dflashd.logs.drain import PipeDrain, pending_bytes
from dflashd.logs.framer import Frame
from dflashd.logs.linecodec import CODEC

needs_c = pytest.mark.skipif(CODEC.wait_bytes is None, reason="the C loops are not in use here")


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)  # as the drain holds it
    yield read_fd, write_fd
    for fd in (read_fd, write_fd):
        try:
            os.close(fd)
        except OSError:
            pass


@pytest.fixture
def bell() -> Iterator[tuple[int, int]]:
    bell_r, bell_w = os.pipe()
    os.set_blocking(bell_r, False)
    yield bell_r, bell_w
    os.close(bell_r)
    os.close(bell_w)


def _waiting(read_fd: int, bell: tuple[int, int]) -> tuple[threading.Thread, list[int]]:
    assert CODEC.wait_bytes is not None
    wait_bytes = CODEC.wait_bytes
    said: list[int] = []
    thread = threading.Thread(target=lambda: said.append(wait_bytes(read_fd, *bell)), daemon=True)
    thread.start()
    return thread, said


@needs_c
def test_the_wait_takes_nothing_from_the_pipe_and_leaves_its_flags(
    pipe: tuple[int, int], bell: tuple[int, int]
) -> None:
    read_fd, write_fd = pipe
    assert CODEC.wait_bytes is not None
    os.write(write_fd, b"step 1 loss 2.5\npartial")
    flags = fcntl.fcntl(read_fd, fcntl.F_GETFL)
    assert CODEC.wait_bytes(read_fd, *bell) == 1
    assert pending_bytes(read_fd) == len(b"step 1 loss 2.5\npartial")  # every byte still there
    assert fcntl.fcntl(read_fd, fcntl.F_GETFL) == flags  # non-blocking again
    with pytest.raises(BlockingIOError):
        os.read(bell[0], 16)  # the bell's byte was read back
    assert os.read(read_fd, 100) == b"step 1 loss 2.5\npartial"


@needs_c
def test_the_wait_ends_at_the_next_write(pipe: tuple[int, int], bell: tuple[int, int]) -> None:
    read_fd, write_fd = pipe
    thread, said = _waiting(read_fd, bell)
    os.write(write_fd, b"epoch 2\n")
    thread.join(10)
    assert said == [1]
    assert os.read(read_fd, 100) == b"epoch 2\n"


@needs_c
def test_the_wait_ends_when_the_last_writer_is_gone(
    pipe: tuple[int, int], bell: tuple[int, int]
) -> None:
    read_fd, write_fd = pipe
    thread, said = _waiting(read_fd, bell)
    os.close(write_fd)
    thread.join(10)
    assert said == [1]
    assert os.read(read_fd, 100) == b""  # the read that follows sees the end


@needs_c
def test_a_descriptor_that_is_no_pipe_is_refused(bell: tuple[int, int]) -> None:
    assert CODEC.wait_bytes is not None
    left, right = socket.socketpair()
    with left, right, pytest.raises(OSError):
        CODEC.wait_bytes(left.fileno(), *bell)


class _Frames:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.came = threading.Event()

    def submit_frame(self, run: int, src: str, frame: Frame) -> None:
        self.lines.extend(frame.last_lines(len(frame)))
        self.came.set()


@needs_c
def test_a_drain_over_a_pipe_never_polls_it(
    monkeypatch: pytest.MonkeyPatch, pipe: tuple[int, int]
) -> None:
    read_fd, write_fd = pipe

    def no_poll() -> object:
        raise AssertionError("the drain polled its pipe")

    monkeypatch.setattr(select, "poll", no_poll)
    frames = _Frames()
    drain = PipeDrain(read_fd, run=1, src="stdout", sink=frames)
    for step in range(5):  # each line after a pause: the drain waits on an empty pipe each time
        frames.came.clear()
        os.write(write_fd, f"step {step}\n".encode())
        assert frames.came.wait(10)
    os.close(write_fd)
    assert drain.wait_eof(10)
    assert drain.error is None
    assert frames.lines == [f"step {step}" for step in range(5)]


def test_a_drain_over_a_socket_waits_with_poll() -> None:
    left, right = socket.socketpair()
    frames = _Frames()
    drain = PipeDrain(os.dup(left.fileno()), run=1, src="stdout", sink=frames)
    left.close()
    with right:
        for step in range(3):
            frames.came.clear()
            right.sendall(f"step {step}\n".encode())
            assert frames.came.wait(10)
    assert drain.wait_eof(10)
    assert frames.lines == ["step 0", "step 1", "step 2"]
