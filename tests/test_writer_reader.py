"""The rotating writer and the readers, on real files."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from dflashd.logs import (
    EventRecord,
    Frame,
    LineRecord,
    LogSink,
    LogWriterError,
    RecordFilter,
    RotatingLogWriter,
    follow,
    last_records,
    log_files,
    read_records,
)
from dflashd.logs.laterclose import THREAD_NAME, wait_closed
from dflashd.logs.logdir import LogDir
from tests.faults.fsfaults import faulty_writer


def lines_frame(lines: list[str]) -> Frame:
    """A fast-path frame of complete lines."""
    return Frame(lines, None, sum(len(x) + 1 for x in lines))


def write_numbered(
    writer: RotatingLogWriter, count: int, run: int = 1, src: str = "stdout"
) -> None:
    """Write `count` lines, ten per frame, each naming its own number."""
    for start in range(0, count, 10):
        writer.write_frame(
            run, src, lines_frame([f"line {i:06d}" for i in range(start, min(count, start + 10))])
        )


def test_rotation_keeps_whole_records_and_bounds_the_total(tmp_path: Path) -> None:
    """Rotation renames at max_bytes, keeps `backups` files and only whole JSON lines."""
    with RotatingLogWriter(tmp_path, max_bytes=4096, backups=3) as writer:
        write_numbered(writer, 5000)
        assert writer.stats().rotations > 10
    files = log_files(tmp_path)
    assert [p.name for p in files] == [
        "dflashd.jsonl.3",
        "dflashd.jsonl.2",
        "dflashd.jsonl.1",
        "dflashd.jsonl",
    ]
    for path in files:
        data = path.read_bytes()
        assert data == b"" or data.endswith(b"\n")
        assert len(data) < 4096 + 2048  # one batch past the threshold at most
    seqs = [r.seq for r in read_records(tmp_path)]
    assert seqs == list(range(seqs[0], 5001))  # contiguous, ending with the last record


def test_seq_continues_after_reopen_and_a_torn_last_line(tmp_path: Path) -> None:
    """A crash mid-record leaves a torn line: reopening cuts it and continues the seq."""
    with RotatingLogWriter(tmp_path, max_bytes=1 << 20) as writer:
        write_numbered(writer, 30, run=4)
    live = tmp_path / "dflashd.jsonl"
    with open(live, "ab") as fh:
        fh.write(b'{"ts":"2026-01-01T00:00:00.0Z","seq":31,"run":4,"src":"std')
    with RotatingLogWriter(tmp_path, max_bytes=1 << 20) as writer:
        assert writer.torn_bytes > 0
        assert writer.next_seq == 31
        assert writer.last_run == 4
        writer.write_event(5, "spawn", {"argv": ["x"]})
    records = list(read_records(tmp_path))
    assert [r.seq for r in records] == list(range(1, 32))
    assert isinstance(records[-1], EventRecord) and records[-1].event == "spawn"


def test_seq_continues_from_rotated_file_when_live_file_is_empty(tmp_path: Path) -> None:
    """Right after a rotation the live file is empty: the seq comes from the newest backup."""
    with RotatingLogWriter(tmp_path, max_bytes=1024, backups=2) as writer:
        write_numbered(writer, 40)
        writer._rotate()  # end exactly on a rotation
        last = writer.next_seq
    assert (tmp_path / "dflashd.jsonl").stat().st_size == 0
    with RotatingLogWriter(tmp_path, max_bytes=1024, backups=2) as writer:
        assert writer.next_seq == last


def test_unopenable_directory_is_a_clear_error(tmp_path: Path) -> None:
    """A log directory that cannot be created raises LogWriterError naming the path."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(LogWriterError, match=r"cannot open log .*file/logs"):
        RotatingLogWriter(blocker / "logs")


def test_rotation_keeps_files_within_one_record_of_the_bound(tmp_path: Path) -> None:
    """A big batch is split across files: no file exceeds max_bytes by more than one record."""
    with RotatingLogWriter(tmp_path, max_bytes=4096, backups=100) as writer:
        lines = [f"line {i:05d} " + "x" * 60 for i in range(2000)]
        frames = [(1, "stdout", lines_frame(lines[i : i + 500]), 0.0) for i in range(0, 2000, 500)]
        writer.write_frames(frames)
    sizes = [p.stat().st_size for p in tmp_path.iterdir()]
    assert max(sizes) <= 4096
    records = [r for r in read_records(tmp_path) if isinstance(r, LineRecord)]
    # each piece cut at a record's end, written once, in order (the batch is cut by offset)
    assert [(r.seq, r.line) for r in records] == [(i + 1, line) for i, line in enumerate(lines)]


def test_planted_symlink_is_never_followed(tmp_path: Path) -> None:
    """A link planted at the live log's name: nothing reaches its target; the loss is counted."""
    target = tmp_path / "victim"
    target.write_text("precious\n")
    logs = tmp_path / "logs"
    with RotatingLogWriter(logs, max_bytes=1 << 20) as writer:
        writer.write_event(1, "spawn", {})
        live = logs / "dflashd.jsonl"
        live.unlink()
        live.symlink_to(target)
        assert writer.write_event(1, "exit", {}) is None
        assert writer.stats().records_dropped == 1
    assert target.read_text() == "precious\n"


def test_deleted_live_log_is_reopened_before_the_next_write(tmp_path: Path) -> None:
    """rm of the live log: the next record goes to a new file, nothing into the deleted one."""
    with RotatingLogWriter(tmp_path, max_bytes=1 << 20) as writer:
        writer.write_event(1, "spawn", {})
        (tmp_path / "dflashd.jsonl").unlink()
        writer.write_event(1, "exit", {})
    assert [r.event for r in read_records(tmp_path) if isinstance(r, EventRecord)] == ["exit"]


def test_disk_full_is_counted_then_reported(tmp_path: Path) -> None:
    """Writes that fail with ENOSPC are dropped and counted, then reported as log_dropped."""
    writer, fs = faulty_writer(tmp_path, max_bytes=1 << 20)
    writer.write_event(1, "spawn", {})
    fs.failing["write"] = errno.ENOSPC
    assert writer.write_frame(1, "stdout", lines_frame(["lost one", "lost two"])) is False
    stats = writer.stats()
    assert stats.records_dropped == 2 and stats.write_errors == 1
    assert stats.last_error is not None and "ENOSPC" in stats.last_error
    del fs.failing["write"]
    assert writer.write_frame(1, "stdout", lines_frame(["back"])) is True
    writer.close()
    records = list(read_records(tmp_path))
    assert [getattr(r, "event", None) for r in records] == ["spawn", "log_dropped", None]
    dropped, back = records[1], records[2]
    assert isinstance(dropped, EventRecord)
    assert dropped.fields["records"] == 2 and "ENOSPC" in dropped.fields["error"]
    assert isinstance(back, LineRecord) and back.line == "back"
    assert back.seq == dropped.seq + 1


def test_last_records_reads_only_the_end(tmp_path: Path) -> None:
    """last_records returns the last N matching records across files, in order."""
    with RotatingLogWriter(tmp_path, max_bytes=2048, backups=50) as writer:
        write_numbered(writer, 300, run=1, src="stdout")
        write_numbered(writer, 5, run=2, src="stderr")
        write_numbered(writer, 300, run=2, src="stdout")
    tail = last_records(tmp_path, 7, RecordFilter(run=2, src="stderr"))
    assert [r.line for r in tail if isinstance(r, LineRecord)] == [
        f"line {i:06d}" for i in range(5)
    ]
    last3 = last_records(tmp_path, 3)
    assert [r.seq for r in last3] == [603, 604, 605]


def test_follow_survives_rotation_under_concurrent_writing(tmp_path: Path) -> None:
    """A follower sees every record exactly once while the writer rotates many times."""
    total = 20_000
    writer = RotatingLogWriter(tmp_path, max_bytes=8192, backups=400)
    done = threading.Event()
    seen: list[int] = []

    def produce() -> None:
        write_numbered(writer, total)
        done.set()

    def consume() -> None:
        for rec in follow(
            tmp_path, poll_s=0.01, should_stop=lambda: done.is_set() and len(seen) >= total
        ):
            seen.append(rec.seq)

    follower = threading.Thread(target=consume)
    follower.start()
    producer = threading.Thread(target=produce)
    producer.start()
    producer.join(60)
    follower.join(60)
    writer.close()
    assert not follower.is_alive()
    assert writer.stats().rotations > 50
    assert seen == list(range(1, total + 1))


def test_sink_writes_in_submission_order_and_flushes(tmp_path: Path) -> None:
    """The sink's writer thread keeps order between frames and events; flush waits for both."""
    sink = LogSink(RotatingLogWriter(tmp_path))
    sink.submit_event(1, "spawn", {"argv": ["a"]})
    sink.submit_frame(1, "stdout", lines_frame(["one", "two"]))
    sink.submit_event(1, "exit", {"exit_code": 0})
    assert sink.flush(5.0)
    kinds = [r.event if isinstance(r, EventRecord) else r.line for r in read_records(tmp_path)]
    assert kinds == ["spawn", "one", "two", "exit"]
    sink.close()


def test_a_rotation_shifts_only_the_files_present_in_any_form(tmp_path: Path) -> None:
    """One directory scan: base.N (plain, .zst or .gz) moves up one; base.<backups> goes; a
    number above the bound (an older, larger setting) and foreign names stay; the new live
    file takes the live name."""
    from dflashd.logs.logdir import LogDir, rotate_into_place
    from dflashd.logs.resume import numbered_files, plain_rotated

    for name in (
        "run.jsonl",
        ".run.jsonl.new",
        "run.jsonl.1",
        "run.jsonl.2.zst",
        "run.jsonl.3.gz",
        "run.jsonl.5",
        "run.jsonl.2.zst.part",
        "other.1",
    ):
        (tmp_path / name).write_text(name)
    assert plain_rotated(tmp_path, "run.jsonl", 3) == [tmp_path / "run.jsonl.1"]
    rotated = rotate_into_place(LogDir(tmp_path), "run.jsonl", 3, ".run.jsonl.new")
    assert rotated.newest == "run.jsonl.1"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "other.1",
        "run.jsonl",
        "run.jsonl.1",
        "run.jsonl.2",
        "run.jsonl.2.zst.part",
        "run.jsonl.3.zst",
        "run.jsonl.5",
    ]
    assert (tmp_path / "run.jsonl.3.zst").read_text() == "run.jsonl.2.zst"
    assert (tmp_path / "run.jsonl.1").read_text() == "run.jsonl"
    assert (tmp_path / "run.jsonl").read_text() == ".run.jsonl.new"
    assert numbered_files(tmp_path, "run.jsonl") == {
        1: ["run.jsonl.1"],
        2: ["run.jsonl.2"],
        3: ["run.jsonl.3.zst"],
        5: ["run.jsonl.5"],
    }


def test_the_oldest_file_is_removed_without_its_blocks_freed_on_the_writers_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rotation past ``backups`` removes the oldest file on the writer's thread; its blocks
    are freed at its last close (100 MiB written back: ~55 ms on ext4), which the writer hands
    to the closer thread: only the name goes on the writer's (issue 53)."""
    writer = RotatingLogWriter(tmp_path, max_bytes=4096, backups=2)
    write_numbered(writer, 400)  # rotations enough that each removes the oldest
    assert writer.stats().rotations > 2
    closed_on: list[str] = []  # the threads that closed the last descriptor of a removed file
    real_close = os.close

    def close(fd: int) -> None:
        try:
            if os.fstat(fd).st_nlink == 0:
                closed_on.append(threading.current_thread().name)
        except OSError:
            pass
        real_close(fd)

    monkeypatch.setattr(os, "close", close)
    rotations = writer.stats().rotations
    write_numbered(writer, 200)  # the next rotations remove the oldest files
    assert writer.stats().rotations > rotations
    assert wait_closed(10)
    writer.close()
    assert len(log_files(tmp_path)) == 3  # the live file and two backups: the rest removed
    assert closed_on and set(closed_on) == {THREAD_NAME}, closed_on


def test_a_fifo_or_a_link_in_the_set_is_removed_without_being_opened(tmp_path: Path) -> None:
    """What the rotation holds across an unlink is an O_PATH reference: a FIFO planted in the
    set (an open for reading would wait for a writer) or a link is removed at once."""
    os.mkfifo(tmp_path / "dflashd.jsonl.3")
    (tmp_path / "dflashd.jsonl.4").symlink_to("/etc/passwd")
    logdir = LogDir(tmp_path)
    try:
        logdir.unlink("dflashd.jsonl.3")
        logdir.unlink("dflashd.jsonl.4")
    finally:
        logdir.close()
    assert wait_closed(10)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    assert Path("/etc/passwd").exists()
