"""Issue 21, part 2: a full disk or a damaged file never costs lines already written.

Real files throughout: a real tmpfs filled to the last page (root only; skipped, visibly,
elsewhere), a rotated file deleted by hand, a truncated ``.gz`` and a ``.gz`` that is not
gzip at all, read by the real ``tail`` and ``report`` commands.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from dflashd.logs import EventRecord, LineRecord, read_records
from dflashd.logs.framer import Frame
from dflashd.logs.writer import RotatingLogWriter
from dflashd.supervisor.host.home import Home
from tests.conftest import run_cli
from tests.faults.conftest import fill


def _frame(lines: list[bytes]) -> Frame:
    return Frame([line.decode() for line in lines], None, sum(len(x) + 1 for x in lines))


def test_a_full_disk_never_pushes_history_out_and_every_loss_is_counted(small_disk: Path) -> None:
    """300 lines, then the disk fills and 2,400 lines come in batches larger than a file:
    the 300 stay, and the log_dropped records add up exactly to what is missing."""
    logs = small_disk / "logs"
    writer = RotatingLogWriter(logs, max_bytes=8192, backups=10)
    early = [f"early line {i:04d} loss=1.0".encode() for i in range(300)]
    for i in range(0, 300, 10):
        writer.write_frames([(1, "stdout", _frame(early[i : i + 10]), 1.7e9)])
    fill(small_disk / "filler")
    late = [f"late line {i:05d} ".encode() + b"x" * 80 for i in range(2400)]
    for i in range(0, 2400, 100):  # 100 lines, ~10 KiB: each batch spans the 8 KiB bound
        writer.write_frames([(1, "stdout", _frame(late[i : i + 100]), 1.7e9)])
    (small_disk / "filler").unlink()
    after = [f"after line {i}".encode() for i in range(5)]
    writer.write_frames([(1, "stdout", _frame(after), 1.7e9)])
    writer.close()

    records = list(read_records(logs))
    lines = [r.line.encode() for r in records if isinstance(r, LineRecord)]
    assert [x for x in lines if x.startswith(b"early")] == early
    assert [x for x in lines if x.startswith(b"after")] == after
    dropped = sum(
        int(r.fields["records"])
        for r in records
        if isinstance(r, EventRecord) and r.event == "log_dropped"
    )
    missing = len(early) + len(late) + len(after) - len(lines)
    assert missing > 0 and dropped == missing
    seqs = [r.seq for r in records]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


@pytest.fixture
def damaged_home(tmp_path: Path) -> Path:
    """A home whose log set has 6 rotated files of 20 lines each and a live one."""
    home = tmp_path / "home"
    Home(home).create()
    writer = RotatingLogWriter(home / "logs", max_bytes=2048, backups=30)
    writer.write_event(1, "spawn", {"argv": ["python", "train.py"], "cwd": "/"})
    for i in range(140):
        writer.write_frames([(1, "stdout", _frame([f"step {i} loss 1.0".encode()]), 1.7e9 + i)])
    writer.write_event(1, "exit", {"verdict": "crashed", "reason": "SIGKILL", "exit_code": None})
    writer.write_frames([(1, "stdout", _frame([b"the last line"]), 1.7e9 + 200)])
    writer.close()
    return home


def _gzip_in_place(path: Path) -> Path:
    packed = path.with_name(path.name + ".gz")
    packed.write_bytes(gzip.compress(path.read_bytes()))
    path.unlink()
    return packed


def _check_readers(home: Path, tmp_path: Path, said: str) -> None:
    tail = run_cli("tail", "--home", str(home), "-n", "3")
    assert tail.returncode == 0, tail.stderr
    assert "the last line" in tail.stdout and len(tail.stdout.splitlines()) == 3
    assert "Traceback" not in tail.stderr
    everything = run_cli("tail", "--home", str(home), "-n", "100000")
    assert everything.returncode == 0, everything.stderr
    assert "Aborted" not in everything.stderr + everything.stdout
    assert said in everything.stderr and "Traceback" not in everything.stderr
    assert "step 139 loss" in everything.stdout and "step 0 loss" in everything.stdout
    out = tmp_path / "r.html"
    report = run_cli("report", "--home", str(home), "-o", str(out))
    assert report.returncode == 0, report.stderr
    assert "Traceback" not in report.stderr and "no runs" not in report.stdout + report.stderr
    assert out.stat().st_size > 0


def test_a_rotated_file_deleted_by_hand_leaves_the_rest_readable(
    damaged_home: Path, tmp_path: Path
) -> None:
    """A hole in the numbering: tail and report read what is there and say what is missing."""
    (damaged_home / "logs" / "dflashd.jsonl.3").unlink()
    _check_readers(damaged_home, tmp_path, "dflashd.jsonl.3 missing")


def test_a_truncated_gz_is_read_up_to_the_damage(damaged_home: Path, tmp_path: Path) -> None:
    packed = _gzip_in_place(damaged_home / "logs" / "dflashd.jsonl.3")
    data = packed.read_bytes()
    packed.write_bytes(data[: len(data) // 2])
    _check_readers(damaged_home, tmp_path, "damaged")


def test_a_gz_that_is_not_gzip_blinds_no_reader(damaged_home: Path, tmp_path: Path) -> None:
    (damaged_home / "logs" / "dflashd.jsonl.2").unlink()
    (damaged_home / "logs" / "dflashd.jsonl.2.gz").write_bytes(b"this is not gzip\n" * 10)
    _check_readers(damaged_home, tmp_path, "damaged")
