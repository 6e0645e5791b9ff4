"""The sink gives the C allocator's free memory back after a burst of output, once idle, at
most every TRIM_EVERY_S (a chatty job's buffers otherwise stay with the daemon: issue 53)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from dflashd.logs import sink as sink_module
from dflashd.logs.framer import LineFramer
from dflashd.logs.heap import release_free_memory
from dflashd.logs.sink import TRIM_AFTER_BYTES, LogSink
from dflashd.logs.writer import RotatingLogWriter


def _frame_of(nbytes: int) -> object:
    line = b"step 1 loss 2.0 " + b"x" * 100 + b"\n"
    frame = LineFramer().feed(line * (nbytes // len(line)))
    assert frame is not None
    return frame


def test_a_burst_is_followed_by_one_trim_once_the_queue_is_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sink_module, "TRIM_EVERY_S", 0.0)
    trims: list[int] = []
    sink = LogSink(RotatingLogWriter(tmp_path), trim=lambda: trims.append(1))
    frame = _frame_of(256 * 1024)
    for _ in range(2 * TRIM_AFTER_BYTES // (256 * 1024) + 2):
        sink.submit_frame(1, "stdout", frame)  # type: ignore[arg-type]
    assert sink.flush(30)
    sink.close()
    assert 1 <= len(trims) <= 2


def test_a_burst_then_silence_is_trimmed_without_more_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The buffers kept for reuse during a burst (logs/heap.py) go back once it has stopped,
    though no further output comes to wake the writer."""
    monkeypatch.setattr(sink_module, "TRIM_EVERY_S", 1.0)
    monkeypatch.setattr(sink_module, "TRIM_QUIET_S", 0.05)
    trimmed = threading.Event()
    sink = LogSink(RotatingLogWriter(tmp_path), trim=trimmed.set)
    frame = _frame_of(256 * 1024)
    for _ in range(TRIM_AFTER_BYTES // (256 * 1024) + 2):
        sink.submit_frame(1, "stdout", frame)  # type: ignore[arg-type]
    assert sink.flush(30)
    assert trimmed.wait(30)
    sink.close()


def test_a_trickle_never_trims(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sink_module, "TRIM_EVERY_S", 0.0)
    trims: list[int] = []
    sink = LogSink(RotatingLogWriter(tmp_path), trim=lambda: trims.append(1))
    frame = _frame_of(64 * 1024)
    for _ in range(4):
        sink.submit_frame(1, "stdout", frame)  # type: ignore[arg-type]
    assert sink.flush(30)
    sink.close()
    assert trims == []


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_the_real_trim_gives_freed_heap_memory_back() -> None:
    """40 MiB of 100 KiB buffers (below malloc's mmap threshold: on the heap) freed but for the
    last, which holds the heap's top: free inside the heap, kept, until the trim."""
    pytest.importorskip("ctypes")
    buffers = [bytearray(100 * 1024) for _ in range(400)]
    for buffer in buffers:
        buffer[::4096] = b"x" * len(buffer[::4096])  # touched: resident
    last = buffers[-1]
    del buffers
    before = _rss_kib()
    release_free_memory()
    after = _rss_kib()
    assert len(last) == 100 * 1024
    assert after < before - 20 * 1024, (before, after)
