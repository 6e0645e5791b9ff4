"""Issue 34: rotated files still plain when the daemon ends are compressed after it is gone.

A real daemon runs a 20,000-line job on a small ``max_bytes`` and exits when the job
completes; its finisher (``squeeze.py finish``, holding the set's compression lock) compresses
what was left.  The test waits on that lock (flock), then finds every rotated file packed,
whole, and every record there once.  A second writer rotating while a finisher places files
loses nothing and compresses nothing twice.
"""

from __future__ import annotations

import fcntl
import os
import select
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from dflashd.logs import LineRecord, read_records
from dflashd.logs.compress import LOCK_NAME
from tests.conftest import Daemon, child

LINES = 20000


def _wait_for_compression(logs: Path) -> None:
    """Blocks until no process holds the set's compression lock (the finisher's exit)."""
    fd = os.open(logs / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    finally:
        os.close(fd)


def _plain_rotated(logs: Path) -> list[str]:
    return sorted(
        p.name
        for p in logs.iterdir()
        if p.name.startswith("dflashd.jsonl.") and p.name.rsplit(".", 1)[-1].isdigit()
    )


def test_the_files_left_plain_at_exit_are_compressed_after_the_daemon(
    start_daemon: Callable[..., Daemon], home: Path
) -> None:
    job = child("flood_and_exit.py", str(LINES))
    daemon = start_daemon(job, logs={"max_bytes": 65536, "backups": 100, "compress": True})
    assert daemon.wait(120) == 0
    logs = home / "logs"
    _wait_for_compression(logs)
    assert _plain_rotated(logs) == []
    packed = [p for p in logs.iterdir() if p.suffix in (".zst", ".gz")]
    assert len(packed) >= 10
    assert not [p for p in logs.iterdir() if p.name.startswith(".compressing-")]
    lines = [r for r in read_records(logs) if isinstance(r, LineRecord)]
    assert len(lines) == LINES and len({r.seq for r in lines}) == LINES


WRITER = r"""
import sys
from pathlib import Path
from dflashd.logs import RotatingLogWriter
from dflashd.logs.framer import Frame
logs, first, count = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
writer = RotatingLogWriter(logs, max_bytes=65536, backups=200, compress=True)
pad = "x" * 180
for i in range(first, first + count):
    writer.write_frame(1, "stdout", Frame([f"line {i} {pad}"], None, 190))
writer.close(compress_wait_s=0.0)  # exit at once: the finisher takes the rest
print(writer.finisher.pid if writer.finisher is not None else 0, flush=True)
"""


def _write_and_close(logs: Path, first: int, count: int) -> int:
    """A writer process writes ``count`` lines from ``first`` and exits at once; its
    finisher's pid (0: none was needed)."""
    done = subprocess.run(
        [sys.executable, "-c", WRITER, str(logs), str(first), str(count)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return int(done.stdout.strip())


def _wait_exit(pid: int) -> None:
    """Until the process has exited (its pidfd readable), or it is gone already."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    select.select([pidfd], [], [], 120)
    os.close(pidfd)


def test_a_new_writer_rotating_beside_a_finisher_loses_and_doubles_nothing(
    tmp_path: Path,
) -> None:
    logs = tmp_path / "logs"
    finisher = _write_and_close(logs, 0, 4000)
    assert finisher > 0  # it closed with files in hand: a finisher took them over
    # a second "daemon" starts and rotates while the finisher may still be placing files
    _write_and_close(logs, 4000, 4000)
    _wait_exit(finisher)  # the first finisher's exit
    _wait_for_compression(logs)  # and the second's, if it had one
    assert _plain_rotated(logs) == []
    names = [p.name for p in logs.iterdir()]
    bases = [n.rsplit(".", 1)[0] for n in names if n.endswith((".zst", ".gz"))]
    assert len(bases) == len(set(bases))  # no file packed twice
    lines = [r.line.split()[1] for r in read_records(logs) if isinstance(r, LineRecord)]
    assert sorted(map(int, lines)) == list(range(8000))


def test_a_finisher_started_while_another_holds_the_lock_waits_then_compresses_the_rest(
    tmp_path: Path,
) -> None:
    """A daemon closes with files plain while an earlier daemon's finisher holds the set's
    compression lock: its own finisher starts anyway and waits for the lock (the earlier one
    may have looked at the set for the last time before these files were rotated)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    held = os.open(logs / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(held, fcntl.LOCK_EX)  # the earlier daemon's finisher, at work
    try:
        finisher = _write_and_close(logs, 0, 4000)
        assert finisher > 0
        assert _plain_rotated(logs)  # nothing compressed while the lock is held elsewhere
    finally:
        os.close(held)  # the earlier finisher is done
    _wait_exit(finisher)
    assert _plain_rotated(logs) == []
    lines = [r.line.split()[1] for r in read_records(logs) if isinstance(r, LineRecord)]
    assert sorted(map(int, lines)) == list(range(4000))
