"""The flood's writes in one C call (issue 53): the writer's check of its live file's name, the
encode of a batch's records and their write (``CODEC.append_records``), without the GIL.  It
must write exactly what the three calls it replaces wrote, and leave every failure to the
general path: a name that moved, a full disk.  Real files, a real tmpfs.  (The echo's writer
thread: tests/test_echo_writer.py.)"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from dflashd.logs import linecodec
from dflashd.logs.framer import Frame, LineFramer
from dflashd.logs.logdir import LogDir
from dflashd.logs.records import RECORD_END, EventRecord, LineRecord, decode, record_pieces
from dflashd.logs.writer import RotatingLogWriter
from tests.faults.conftest import mounted_tmpfs

_lines = pytest.importorskip("dflashd.logs._lines", reason="the C loops were not built here")

WALL = 1_800_000_000.25


def scanned(lines: list[bytes]) -> Frame:
    """A frame the way the drain's C read makes one: scanned, its text JSON-safe."""
    frame = LineFramer(1 << 20).feed(b"\n".join(lines) + b"\n")
    assert frame is not None and frame.text is not None
    return frame


def step_lines(first: int, count: int) -> list[bytes]:
    return [
        b"step %d loss %.3f " % (i, i / 7) + b"x" * (i % 90) for i in range(first, first + count)
    ]


def record_bytes(directory: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(directory.glob("dflashd.jsonl*"), reverse=True))


@pytest.fixture
def counted_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many batches went through the one call (LogDir.append_records)."""
    calls: list[int] = []
    real = LogDir.append_records

    def counting(self: LogDir, *args: object, **kwargs: object) -> tuple[int, int, int]:
        calls.append(1)
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(LogDir, "append_records", counting)
    return calls


def test_the_one_call_writes_the_records_the_three_calls_wrote(
    tmp_path: Path, counted_calls: list[int]
) -> None:
    batches = [
        [
            (1, "stdout", scanned(step_lines(0, 700)), WALL),
            (1, "stderr", scanned(step_lines(700, 3)), WALL + 1),
        ],
        [(2, "stdout", scanned(step_lines(703, 1)), WALL + 2)],
    ]
    for name in ("c", "python"):
        previous = linecodec.use(name)
        try:
            with RotatingLogWriter(tmp_path / name) as writer:
                for batch in batches:
                    assert writer.write_frames(batch)
                assert writer.stats().records_written == 704
        finally:
            linecodec.use(previous.implementation)
    # the first batch of a writer goes the general way (the directory's check is due), the
    # next in one call (a second later the check is due again: a stalled box may take more)
    assert len(counted_calls) >= 1
    assert record_bytes(tmp_path / "c") == record_bytes(tmp_path / "python")
    records = [decode(line) for line in record_bytes(tmp_path / "c").splitlines()]
    assert [r.seq for r in records] == list(range(1, 705))
    assert [r.src for r in records[699:704]] == ["stdout", "stderr", "stderr", "stderr", "stdout"]


def test_a_live_file_deleted_between_writes_gets_the_next_batch_in_its_new_file(
    tmp_path: Path, counted_calls: list[int]
) -> None:
    with RotatingLogWriter(tmp_path) as writer:
        assert writer.write_frames([(1, "stdout", scanned(step_lines(0, 10)), WALL)])
        (tmp_path / "dflashd.jsonl").unlink()
        assert writer.write_frames([(1, "stdout", scanned(step_lines(10, 5)), WALL)])
    records = [decode(line) for line in (tmp_path / "dflashd.jsonl").read_bytes().splitlines()]
    assert [r.seq for r in records] == [11, 12, 13, 14, 15]
    assert records[0].line.startswith("step 10 ")  # type: ignore[union-attr]
    assert len(counted_calls) <= 1  # the second tried the one call, found the name gone


def test_a_rotation_inside_a_batch_goes_the_general_way(tmp_path: Path) -> None:
    with RotatingLogWriter(tmp_path, max_bytes=64 * 1024, backups=50) as writer:
        for first in range(0, 3000, 500):
            assert writer.write_frames([(1, "stdout", scanned(step_lines(first, 500)), WALL)])
        assert writer.stats().rotations >= 2
    seqs = [decode(line).seq for line in record_bytes(tmp_path).splitlines()]
    assert seqs == list(range(1, 3001))
    assert all(p.stat().st_size <= 64 * 1024 for p in tmp_path.glob("dflashd.jsonl*"))


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    yield from mounted_tmpfs(tmp_path / "small", "size=256k")


def test_a_full_disk_cuts_the_one_calls_part_back_and_counts_the_batch(
    small_disk: Path, counted_calls: list[int]
) -> None:
    """The C write stops part way (ENOSPC): the file is cut back to whole records, and the
    general path tries once more and counts what the disk refused, as it always did."""
    with RotatingLogWriter(small_disk, max_bytes=1 << 30) as writer:
        written = dropped = 0
        for first in range(0, 20_000, 1000):
            if writer.write_frames([(1, "stdout", scanned(step_lines(first, 1000)), WALL)]):
                written += 1000
            else:
                dropped += 1000
        stats = writer.stats()
    assert dropped and written and stats.records_dropped == dropped
    assert "ENOSPC" in (stats.last_error or "")
    data = (small_disk / "dflashd.jsonl").read_bytes()
    assert data.endswith(b"\n")
    records = [decode(line) for line in data.splitlines()]
    assert [r.seq for r in records] == list(range(1, len(records) + 1))
    lines = [r for r in records if isinstance(r, LineRecord)]
    assert counted_calls  # the one call met the full disk first: its part was cut back
    assert len(lines) == written  # whole batches or nothing; each refusal a log_dropped record
    assert all(isinstance(r, EventRecord) and r.event == "log_dropped" for r in records[written:])


def test_append_records_checks_the_name_and_encodes_as_encode(tmp_path: Path) -> None:
    directory = LogDir(tmp_path)
    fd = directory.open_append("live")
    st = os.fstat(fd)
    lines = step_lines(0, 40)
    head, mid = record_pieces(3, "stdout", "2026-12-05T00:00:00.000000Z")
    frames = (
        (b"\n".join(lines[:30]), 30, head, 5, mid),
        (b"\n".join(lines[30:]), 10, head, 35, mid),
    )
    expected = b"".join(linecodec.encode_python(*f, RECORD_END) for f in frames)
    assert directory.append_records(fd, "live", (st.st_dev, st.st_ino), frames, RECORD_END) == (
        len(expected),
        len(expected),
        0,
    )
    assert (tmp_path / "live").read_bytes() == expected
    os.rename(tmp_path / "live", tmp_path / "moved")  # the name no longer names the file
    assert directory.append_records(fd, "live", (st.st_dev, st.st_ino), frames, RECORD_END)[2] == -1
    with pytest.raises(ValueError):  # a frame that does not hold its count: nothing written
        bad = ((b"a\nb", 3, head, 1, mid),)
        directory.append_records(fd, "moved", (st.st_dev, st.st_ino), bad, RECORD_END)
    assert (tmp_path / "moved").read_bytes() == expected
    os.close(fd)
    directory.close()
