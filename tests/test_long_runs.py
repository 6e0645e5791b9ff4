"""Long runs (issue 16): daemon.log rotates, runs.sqlite is bounded, big logs are read fast.

Real files throughout: a real daemon.log with its fds redirected on rotation, a real sqlite
file, a real rotated run log with a torn tail.
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

from dflashd.logs import EventRecord, RotatingLogWriter, read_records
from dflashd.logs.framer import Frame
from dflashd.logs.reader import RecordFilter
from dflashd.supervisor.speak.daemonlog import DaemonLog, is_daemon_log, rotated_name
from dflashd.supervisor.speak.history import PRUNE_EVERY, RunHistory


def test_daemon_log_rotates_by_size_and_count_and_the_fds_follow(tmp_path: Path) -> None:
    path = tmp_path / "daemon.log"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    spare = os.dup(fd)  # stands for fds 1 and 2 of the detached daemon
    try:
        log = DaemonLog(path, max_bytes=4096, backups=2, fds=(spare, fd))
        record = '{"event":"restart","run":1,"delay_s":0.0}\n'
        for _ in range(1000):  # ~42 KB: ten rotations' worth
            log.write(record)
        os.write(spare, b"a stray write lands in the current file\n")
        files = sorted(tmp_path.glob("daemon.log*"))
        assert [f.name for f in files] == ["daemon.log", "daemon.log.1", "daemon.log.2"]
        assert log.rotations >= 9
        assert all(f.stat().st_size < 4096 + len(record) + 64 for f in files)
        assert path.read_text().endswith("a stray write lands in the current file\n")
        assert is_daemon_log(fd, path) and not is_daemon_log(fd, rotated_name(path, 1))
    finally:
        os.close(fd)
        os.close(spare)


def test_runs_sqlite_keeps_the_newest_runs(tmp_path: Path) -> None:
    db_path = tmp_path / "runs.sqlite"
    history = RunHistory(db_path, keep_runs=100)
    for run in range(1, 451):
        history.started(run, float(run), 1000 + run, "job")
    history.close()
    db = sqlite3.connect(db_path)
    low, high, count = db.execute("SELECT MIN(run), MAX(run), COUNT(*) FROM runs").fetchone()
    db.close()
    assert high == 450 and count <= 100 + PRUNE_EVERY and low > 450 - 100 - PRUNE_EVERY


def _mixed_log(directory: Path) -> RotatingLogWriter:
    writer = RotatingLogWriter(directory, max_bytes=64 * 1024, backups=50)
    for run in range(1, 4):
        writer.write_event(run, "spawn", {"argv": ["job"]})
        for i in range(300):
            # A child line that tries to look like a supervisor record stays a line.
            lines = [f'step {i} loss 1.0 "src":"dflashd" {k}' for k in range(10)]
            writer.write_frame(run, "stdout", Frame(lines, None, 0))
            if i % 50 == 0:
                writer.write_event(run, "progress", {"step": i})
        writer.write_event(run, "exit", {"verdict": "crashed"})
    return writer


def test_the_supervisor_records_fast_path_equals_the_plain_filter(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    writer = _mixed_log(logs)
    writer.close()
    with open(logs / "dflashd.jsonl", "ab") as live:  # a torn tail: never a record
        live.write(b'{"ts":"2026-01-01T00:00:00.000000Z","seq":999999,"run":3,"src":"dflashd","ev')
    assert len(list(logs.iterdir())) > 5  # rotated many times
    everything = list(read_records(logs))
    by_hand = [r for r in everything if isinstance(r, EventRecord)]
    seen: list[int] = []
    fast = list(read_records(logs, RecordFilter(src="dflashd"), progress=seen.append))
    assert [r.seq for r in fast] == [r.seq for r in by_hand]
    assert [r.event for r in fast if isinstance(r, EventRecord)][:2] == ["spawn", "progress"]
    assert sum(seen) > 0.9 * sum(p.stat().st_size for p in logs.iterdir())
    one_run = list(read_records(logs, RecordFilter(run=2, src="dflashd")))
    assert {r.run for r in one_run} == {2} and len(one_run) == 8


def test_since_skips_whole_older_files_and_keeps_the_same_answer(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    clock = [1_800_000_000.0]

    def now() -> float:
        clock[0] += 1.0
        return clock[0]

    writer = RotatingLogWriter(logs, max_bytes=16 * 1024, backups=50, clock=now)
    for i in range(3000):
        writer.write_frame(1, "stdout", Frame([f"line {i}"], None, 0))
    writer.close()
    everything = list(read_records(logs))
    since = everything[-100].ts
    seen: list[int] = []
    got = list(read_records(logs, RecordFilter(since_ts=since), progress=seen.append))
    assert [r.seq for r in got] == [r.seq for r in everything if r.ts >= since]
    grep = RecordFilter(since_ts=since, grep=re.compile(r"line 29\d\d$"))
    assert len(list(read_records(logs, grep))) == sum(1 for r in got if "line 29" in r.line)  # type: ignore[union-attr]


def _numbered(writer: RotatingLogWriter, count: int) -> None:
    for start in range(0, count, 10):
        lines = [f"line {i:06d} step {i} loss 1.0" for i in range(start, min(count, start + 10))]
        writer.write_frame(1, "stdout", Frame(lines, None, 0))


def test_rotated_files_are_compressed_and_read_transparently(tmp_path: Path) -> None:
    """compress=True: rotated files become .N.zst in a helper process; every reader reads them."""
    logs = tmp_path / "logs"
    writer = RotatingLogWriter(logs, max_bytes=16 * 1024, backups=200, compress=True)
    writer.write_event(1, "spawn", {"argv": ["job"]})
    _numbered(writer, 5000)
    writer.write_event(1, "exit", {"verdict": "crashed"})
    assert writer.compressor is not None and writer.compressor.drain(60.0)
    writer.close()
    names = sorted(p.name for p in logs.iterdir())
    packed = [n for n in names if n.endswith(".zst")]
    assert len(packed) > 10 and not [n for n in names if re.search(r"\.\d+$", n)]
    assert not [n for n in names if n.startswith(".compressing")]
    records = list(read_records(logs))
    assert [r.seq for r in records] == list(range(1, 5003))  # seq continuity across .gz files
    events = list(read_records(logs, RecordFilter(src="dflashd")))
    assert [r.event for r in events if isinstance(r, EventRecord)] == ["spawn", "exit"]
    from dflashd.logs import last_records

    assert [r.seq for r in last_records(logs, 3000)] == list(range(2003, 5003))
    assert sum(p.stat().st_size for p in logs.iterdir()) < 0.5 * 5000 * 80  # compressed
    reopened = RotatingLogWriter(logs, max_bytes=16 * 1024, backups=200, compress=True)
    assert reopened.next_seq == 5003  # recovered through the newest file, maybe a .gz
    reopened.close()


def test_follow_survives_rotation_and_compression(tmp_path: Path) -> None:
    """A follower sees every record exactly once while files rotate and get gzipped."""
    import threading

    from dflashd.logs import follow

    total = 8000
    writer = RotatingLogWriter(tmp_path, max_bytes=8192, backups=400, compress=True)
    done = threading.Event()
    seen: list[int] = []

    def consume() -> None:
        stop = lambda: done.is_set() and len(seen) >= total  # noqa: E731
        for rec in follow(tmp_path, poll_s=0.01, should_stop=stop):
            seen.append(rec.seq)

    follower = threading.Thread(target=consume)
    follower.start()
    _numbered(writer, total)
    assert writer.compressor is not None and writer.compressor.drain(60.0)
    done.set()
    follower.join(60)
    writer.close()
    assert not follower.is_alive()
    assert seen == list(range(1, total + 1))
    assert any(p.name.endswith(".zst") for p in tmp_path.iterdir())


_FIRST_WRITER = r"""
import sys, time
from pathlib import Path
from dflashd.logs import RotatingLogWriter
from dflashd.logs.framer import Frame
writer = RotatingLogWriter(Path(sys.argv[1]), max_bytes=64 * 1024, backups=400, compress=True)
for start in range(0, 60_000, 10):
    lines = [f"line {i:06d} step {i} loss 1.0" for i in range(start, min(60_000, start + 10))]
    writer.write_frame(1, "stdout", Frame(lines, None, 0))
started = time.monotonic()
writer.close()
print(round(time.monotonic() - started, 3), flush=True)
"""


def test_exit_is_never_held_by_compression_and_the_next_writer_finishes(tmp_path: Path) -> None:
    """close() waits at most 1 s for the helper; what is left plain is read as such, and is
    compressed after that process exits (its finisher) or by the next writer.  The first
    writer is a process of its own, as a daemon is: a finisher waits for its exit."""
    done = subprocess.run(
        [sys.executable, "-c", _FIRST_WRITER, str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert float(done.stdout.strip()) < 1.5  # ~70 rotations: the close did not wait for them
    assert [r.seq for r in read_records(tmp_path)] == list(range(1, 60_001))
    again = RotatingLogWriter(tmp_path, max_bytes=64 * 1024, backups=400, compress=True)
    assert again.compressor is not None and again.compressor.drain(60.0)
    again.close()
    names = [p.name for p in tmp_path.iterdir()]
    assert not [n for n in names if re.search(r"\.\d+$", n)]  # every rotated file packed
    assert not [n for n in names if n.startswith(".compressing")]
    assert [r.seq for r in read_records(tmp_path)] == list(range(1, 60_001))


def test_old_gz_files_stay_readable_beside_new_zst(tmp_path: Path) -> None:
    """A set rotated by an older dflashd (.gz) and then by this one (.zst) reads as one."""
    import gzip

    writer = RotatingLogWriter(tmp_path, max_bytes=16 * 1024, backups=200, compress=False)
    _numbered(writer, 2000)
    writer.close()
    for path in sorted(tmp_path.glob("dflashd.jsonl.*")):
        path.with_name(path.name + ".gz").write_bytes(gzip.compress(path.read_bytes()))
        path.unlink()
    writer = RotatingLogWriter(tmp_path, max_bytes=16 * 1024, backups=200, compress=True)
    _numbered(writer, 2000)
    assert writer.compressor is not None and writer.compressor.drain(60.0)
    writer.close()
    names = [p.name for p in tmp_path.iterdir()]
    assert any(n.endswith(".gz") for n in names) and any(n.endswith(".zst") for n in names)
    assert [r.seq for r in read_records(tmp_path)] == list(range(1, 4001))


def test_a_damaged_zst_is_read_up_to_the_damage(tmp_path: Path) -> None:
    """A truncated .zst (a full disk during compression, a bad copy) blinds no reader."""
    import zstandard

    from dflashd.logs import logset, packed

    writer = RotatingLogWriter(tmp_path, max_bytes=16 * 1024, backups=200, compress=False)
    _numbered(writer, 3000)
    writer.close()
    victim = tmp_path / "dflashd.jsonl.3"
    data = zstandard.ZstdCompressor(level=3).compress(victim.read_bytes())
    victim.with_name(victim.name + ".zst").write_bytes(data[: len(data) // 2])
    victim.unlink()
    said: list[str] = []
    hook, packed.skipped_hook = packed.skipped_hook, said.append
    try:
        seqs = [r.seq for r in read_records(tmp_path)]
    finally:
        packed.skipped_hook = hook
    assert seqs == sorted(set(seqs)) and len(seqs) > 2500  # everything else, in order
    assert said and "damaged" in said[0]
    assert logset.log_files(tmp_path)  # the set is still listed


def test_tail_grep_follow_keeps_every_matching_line_through_rotation_and_compression(
    tmp_path: Path,
) -> None:
    """Issue 50 (6): ``dflashd tail -f --grep`` as a user runs it, while the log rotates every
    ~8 KiB and a helper compresses each rotated file beside it: every matching line printed,
    once, in order."""
    import selectors
    import time
    from collections.abc import Callable

    from tests.helpers import dflashd_argv

    home = tmp_path / "home"
    writer = RotatingLogWriter(home / "logs", max_bytes=8192, backups=400, compress=True)
    writer.write_event(1, "spawn", {"argv": ["job"]})
    writer.write_frame(1, "stdout", Frame(["ready step 7 "], None, 0))
    argv = dflashd_argv("tail", "-f", "-n", "1", "--home", str(home), "--grep", r"step \d*7 ")
    tail = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert tail.stdout is not None
    out = tail.stdout.fileno()
    picker = selectors.DefaultSelector()
    picker.register(out, selectors.EVENT_READ)
    text = b""

    def read_until(done: Callable[[], bool], timeout: float) -> bytes:
        """The tail's output, read as it comes (its output is the event waited on)."""
        nonlocal text
        deadline = time.monotonic() + timeout
        while not done() and time.monotonic() < deadline:
            if picker.select(timeout=1.0):
                chunk = os.read(out, 65536)
                if not chunk:
                    break
                text += chunk
        return text

    try:
        assert b"ready" in read_until(lambda: b"ready" in text, 60)  # it follows from here on
        total = 6000
        _numbered(writer, total)
        assert writer.compressor is not None and writer.compressor.drain(60.0)
        wanted = [i for i in range(total) if i % 10 == 7]

        def seen() -> list[int]:
            return [int(m) for m in re.findall(rb"line (\d{6}) ", text)]

        read_until(lambda: len(seen()) >= len(wanted), 60)
        assert seen() == wanted, (len(seen()), len(wanted), seen()[:5])
        assert any(p.name.endswith(".zst") for p in (home / "logs").iterdir())
    finally:
        tail.kill()
        tail.wait(10)
        picker.close()
        tail.stdout.close()
        writer.close()
