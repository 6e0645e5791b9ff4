"""Issue 31, part 2: the log writer never dies and never drops history uncounted.

- a property test drives the writer (and the sink's thread) through random sequences of
  ENOSPC, EDQUOT, EROFS, EACCES and EIO from any of its filesystem calls (the seam in
  tests/faults/fsfaults.py: real files, failures injected): records on disk + counted
  drops == records written, no rotated file is ever lost, the thread is alive at the end;
- a real tmpfs out of inodes at rotation time: the set keeps every rotated file, the live
  file grows past its bound (counted), and rotation resumes once inodes are free;
- a real directory made read-only (EACCES) under a writer running as an unprivileged user.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dflashd.logs import EventRecord, LineRecord, LogSink, RotatingLogWriter, read_records
from tests.faults.fsfaults import ERRNOS, OPERATIONS, faulty_writer
from tests.test_writer_reader import lines_frame

WRITERS_OWN = {"log_dropped", "log_rotation_failed", "log_rotation_resumed", "log_dir_replaced"}


@pytest.fixture(autouse=True)
def _no_retry_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """Retry a failed rotation at once (the real wait is 1 s): each example is a few ms."""
    monkeypatch.setattr("dflashd.logs.writer.ROTATE_RETRY_S", 0.0)


def _theirs(directory: Path) -> tuple[int, int]:
    """(line records, supervisor records) on disk, the writer's own records left out."""
    lines = events = 0
    for record in read_records(directory):
        if isinstance(record, LineRecord):
            lines += 1
        elif isinstance(record, EventRecord) and record.event not in WRITERS_OWN:
            events += 1
    return lines, events


def _rotated_files(directory: Path) -> set[tuple[int, int]]:
    """The inodes of the set's rotated files (plain): which files hold history."""
    out = set()
    for path in directory.iterdir():
        if path.name.startswith("dflashd.jsonl."):
            st_ = path.stat()
            out.add((st_.st_dev, st_.st_ino))
    return out


STEP = st.one_of(
    st.tuples(st.just("lines"), st.integers(1, 60)),
    st.tuples(st.just("event"), st.integers(1, 3)),
    st.tuples(st.just("fail"), st.sampled_from(OPERATIONS), st.sampled_from(ERRNOS)),
    st.tuples(st.just("heal"), st.sampled_from(OPERATIONS)),
)


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(STEP, min_size=1, max_size=40))
def test_any_sequence_of_faults_loses_nothing_uncounted(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple]
) -> None:
    directory = tmp_path_factory.mktemp("faulty")
    writer, fs = faulty_writer(directory, max_bytes=1024, backups=10_000)
    lines_written = events_written = 0
    history: set[tuple[int, int]] = set()
    for step in steps:
        if step[0] == "lines":
            frame = lines_frame([f"line {lines_written + i} " + "x" * 40 for i in range(step[1])])
            writer.write_frame(1, "stdout", frame)
            lines_written += step[1]
        elif step[0] == "event":
            for _ in range(step[1]):
                writer.write_event(1, "spawn", {"n": events_written})
                events_written += 1
        elif step[0] == "fail":
            fs.failing[step[1]] = step[2]
        else:
            fs.failing.pop(step[1], None)
        now = _rotated_files(directory)
        assert history <= now, "a rotated file with history was removed"
        history = now
    fs.failing.clear()
    stats = writer.stats()
    writer.close()
    lines_on_disk, events_on_disk = _theirs(directory)
    assert lines_on_disk + events_on_disk + stats.records_dropped == lines_written + events_written


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(STEP, min_size=1, max_size=30))
def test_the_sinks_thread_survives_and_every_supervisor_record_lands(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple]
) -> None:
    """Through the sink: the thread lives, and supervisor records the disk refused are
    written once it takes them again (none is dropped)."""
    directory = tmp_path_factory.mktemp("sink")
    writer, fs = faulty_writer(directory, max_bytes=1024, backups=10_000)
    sink = LogSink(writer)
    lines = events = 0
    for step in steps:
        if step[0] == "lines":
            sink.submit_frame(1, "stdout", lines_frame(["y" * 50] * step[1]))
            lines += step[1]
        elif step[0] == "event":
            for _ in range(step[1]):
                sink.submit_event(1, "exit", {"n": events})
                events += 1
        elif step[0] == "fail":
            fs.failing[step[1]] = step[2]
        else:
            fs.failing.pop(step[1], None)
        assert sink.flush(10.0)
    fs.failing.clear()
    sink.submit_event(1, "done", {})
    assert sink.flush(10.0)
    assert sink._thread.is_alive()
    stats = sink.stats()
    sink.close()
    lines_on_disk, events_on_disk = _theirs(directory)
    assert events_on_disk == events + 1, "a supervisor record was lost"
    assert lines_on_disk + stats.writer.records_dropped == lines


def test_out_of_inodes_at_rotation_keeps_every_rotated_file(few_inodes: Path) -> None:
    logs = few_inodes / "logs"
    writer = RotatingLogWriter(logs, max_bytes=2048, backups=100)
    frame = lines_frame(["z" * 60] * 10)
    for _ in range(10):
        writer.write_frame(1, "stdout", frame)
    assert writer.stats().rotations >= 3
    fillers = few_inodes / "fill"
    fillers.mkdir()
    used = 0
    while True:  # take every inode left
        try:
            (fillers / str(used)).touch()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
            break
        used += 1
    history = _rotated_files(logs)
    for _ in range(40):  # ~14 rotations' worth, none of them possible
        writer.write_frame(1, "stdout", frame)
    assert _rotated_files(logs) == history, "rotated history lost while out of inodes"
    stats = writer.stats()
    assert stats.rotation_failures >= 1 and stats.records_dropped == 0
    assert (logs / "dflashd.jsonl").stat().st_size > 2048  # grew past its bound, counted
    for name in list(fillers.iterdir())[:5]:
        name.unlink()
    import dflashd.logs.writer as writer_module

    writer_module.ROTATE_RETRY_S = 0.0
    writer.write_frame(1, "stdout", frame)
    writer.write_frame(1, "stdout", frame)
    assert writer.stats().rotations > stats.rotations  # rotation resumed
    writer.close()
    events = [r.event for r in read_records(logs) if isinstance(r, EventRecord)]
    assert "log_rotation_failed" in events and "log_rotation_resumed" in events
    lines, _ = _theirs(logs)
    assert lines == 52 * 10


_AS_NOBODY = textwrap.dedent(
    """
    import os, sys
    from dflashd.logs import LogSink, RotatingLogWriter
    from dflashd.logs.framer import Frame
    def lines_frame(lines):
        return Frame(lines, None, sum(len(x) + 1 for x in lines))
    import dflashd.logs.writer as w
    w.ROTATE_RETRY_S = 0.0
    os.setgid(65534); os.setuid(65534)  # everything imported first: root's files stay unread
    sink = LogSink(RotatingLogWriter(sys.argv[1], max_bytes=2048, backups=100))
    for command in sys.stdin:
        kind, count = command.split()
        for i in range(int(count)):
            if kind == "lines":
                sink.submit_frame(1, "stdout", lines_frame(["q" * 60] * 10))
            else:
                sink.submit_event(1, "exit", {"i": i})
        sink.flush(10.0)
        print("ok", sink._thread.is_alive(), sink.stats().writer.records_dropped, flush=True)
    sink.close()
    """
)


def test_a_directory_made_read_only_mid_run_costs_no_record() -> None:
    """EACCES on every create and rename (the directory chmod-ed 0500 under a writer that
    runs as nobody): the thread lives, the exit records land once the directory is back."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run the writer as another user")
    top = Path(tempfile.mkdtemp(prefix="dflashd-nobody-", dir="/tmp"))  # nobody can reach /tmp
    os.chmod(top, 0o755)
    logs = top / "logs"
    logs.mkdir(mode=0o700)
    os.chown(logs, 65534, 65534)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen(
        [sys.executable, "-c", _AS_NOBODY, str(logs)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None

    def ask(line: str) -> list[str]:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(line + "\n")
        proc.stdin.flush()
        return proc.stdout.readline().split()

    try:
        assert ask("lines 10")[:2] == ["ok", "True"]
        history = _rotated_files(logs)
        os.chmod(logs, 0o500)
        assert ask("lines 30")[:2] == ["ok", "True"]
        assert ask("events 3")[:2] == ["ok", "True"]
        assert _rotated_files(logs) == history
        os.chmod(logs, 0o700)
        reply = ask("lines 10")
        assert reply == ["ok", "True", "0"]
        proc.stdin.close()
        proc.wait(30)
        lines, events = _theirs(logs)
        assert (lines, events) == (500, 3)
        assert "log_rotation_failed" in {
            r.event for r in read_records(logs) if isinstance(r, EventRecord)
        }
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        os.chmod(logs, 0o700)
        shutil.rmtree(top)
