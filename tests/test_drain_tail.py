"""The drain's tail (the last lines the ``exit`` record carries) and ``Frame.last_lines``: the
quick paths for a flood's frames (one decode of the frame's last bytes; lines that all end in
``\\n`` added at once) give what the line-by-line rule gives, whatever the lines' lengths."""

from __future__ import annotations

import os
import threading
from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from dflashd.logs.drain import LineTail, PipeDrain
from dflashd.logs.framer import Frame, LineFramer

TAIL = 20


def rule_tail(frames: list[Frame], n: int = TAIL) -> list[str]:
    """The tail by the rule, a line at a time: each frame's last n lines, whitespace-only ones
    left out, a line after one ended by \\r taking its place."""
    tail: deque[str] = deque(maxlen=n)
    redrawn = False
    for frame in frames:
        lines = frame.lines[-n:]
        flags = frame.flags[-len(lines) :] if frame.flags is not None and lines else None
        for i, text in enumerate(lines):
            if not text.strip():
                continue
            if redrawn and tail:
                tail.pop()
            tail.append(text)
            redrawn = flags is not None and flags[i][1] == "\r"
    return list(tail)


class Kept:
    """A sink that keeps every frame, in order."""

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self.lock = threading.Lock()

    def submit_frame(self, run: int, src: str, frame: Frame) -> None:
        with self.lock:
            self.frames.append(frame)


def drained(chunks: list[bytes]) -> tuple[list[str], list[Frame]]:
    """The chunks written through a real pipe to a drain: its tail, and the frames it made."""
    read_end, write_end = os.pipe()
    sink = Kept()
    drain = PipeDrain(read_end, run=1, src="stdout", sink=sink, tail_lines=TAIL)
    for chunk in chunks:
        os.write(write_end, chunk)
    os.close(write_end)
    assert drain.wait_eof(10)
    return list(drain.tail), sink.frames


LINE = st.sampled_from(["", " ", "\t", "step 7 loss 2.5", "x" * 255, "y" * 256, "z" * 700])
ENDED = st.tuples(LINE, st.sampled_from(["\n", "\n", "\n", "\r", "\r\n"]))


def tail_of(chunks: list[bytes]) -> tuple[list[str], list[Frame]]:
    """Each chunk framed as one read of it would be: the tail, and the frames."""
    framer, tail, frames = LineFramer(8192), LineTail(TAIL), []
    for chunk in chunks:
        frame = framer.feed(chunk)
        if frame is not None:
            tail.add(frame)
            frames.append(frame)
    return list(tail.lines), frames


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(ENDED, max_size=60), min_size=1, max_size=6), st.booleans())
def test_the_tail_is_what_the_line_by_line_rule_gives(
    chunks: list[list[tuple[str, str]]], cut: bool
) -> None:
    """Frames of every kind in a row (a quick one after a bar's \r among them); ``cut``: each
    chunk's last byte goes with the next, so a line is held back across frames."""
    data = [("".join(line + end for line, end in chunk)).encode() for chunk in chunks]
    if cut:
        data = [b"".join(data)[i : i + 97] for i in range(0, sum(map(len, data)), 97)]
    tail, frames = tail_of(data)
    assert tail == rule_tail(frames)


def test_a_flood_of_long_lines_leaves_its_last_lines() -> None:
    """Lines longer than the quick path's guess (256 bytes): the last 20, whole."""
    lines = [f"{i:05d} " + "w" * (300 + i) for i in range(400)]
    tail, _ = drained([("\n".join(lines) + "\n").encode()])
    assert tail == lines[-TAIL:]


def test_a_bar_redrawn_then_a_floods_frame_shows_the_bar_once_in_its_last_state() -> None:
    """The quick path (a frame of "\n" lines) after a frame whose last line ended in \r: its
    first line is the bar's redraw (tqdm's last state, then its newline), as line by line."""
    tail, frames = tail_of([b"epoch 1\n10%\r50%\r100%\rdone", b" 10/10\n   \nstep 1 loss 3.0\n"])
    assert [frame.flags is None for frame in frames] == [False, True]
    assert tail == ["epoch 1", "done 10/10", "step 1 loss 3.0"]


def test_a_pipe_drains_tail_is_the_rule_over_its_frames() -> None:
    lines = [b"step %d loss 2.5" % i for i in range(3000)]
    tail, frames = drained([b"\n".join(lines[i : i + 500]) + b"\n" for i in range(0, 3000, 500)])
    assert tail == rule_tail(frames) == [line.decode() for line in lines[-TAIL:]]


@given(
    lines=st.lists(
        st.sampled_from(["a", "", "b" * 255, "c" * 256, "d" * 257, "e" * 3000]), max_size=80
    ),
    n=st.integers(0, 30),
)
def test_last_lines_of_long_and_short_lines_are_the_last_lines(lines: list[str], n: int) -> None:
    frame = LineFramer(8192).feed("".join(f"{line}\n" for line in lines).encode())
    if frame is None:
        assert lines == []
        return
    assert frame.text is not None  # the quick path's frame
    assert frame.last_lines(n) == (lines[-n:] if n else [])
