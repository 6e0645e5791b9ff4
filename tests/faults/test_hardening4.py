"""Issue 40 (hardening IV): each property with real processes, real links, real users, real files.

1. never write through another user's link: ``report -o`` onto a planted symlink, the
   compression finisher with its logs directory swapped for a link to an archive, the
   rotation lock and both sockets with the logs directory or the home swapped mid-run;
2. never run what the user did not ask: ``restart`` on a damaged record of the last start;
3. readers and reports that never lie: ``tail`` while the finisher compresses under it, the
   report of a live run, goodput totals across a SIGKILLed daemon;
4. every Ctrl-C of ``start`` is one line and exit 130: tests/faults/test_ctrl_c.py.

The setsid chain under ``stop`` is tests/faults/test_custody.py's, in every custody mode.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dflashd.logs import EventRecord, LineRecord, RotatingLogWriter, read_records
from dflashd.logs.compress import SQUEEZE, helper_env
from dflashd.logs.framer import Frame
from dflashd.logs.packed import zstd_home
from dflashd.supervisor.host.home import lock_is_held
from tests.conftest import Daemon, child, dflashd_argv, run_cli

Start = Callable[..., Daemon]
STEPPING = child("steps_then.py", "0.1", "1000000", "sleep")  # a step every 0.1 s, for ever


def _nobody() -> tuple[int, int]:
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no 'nobody' user here")
    if os.geteuid() != 0:
        pytest.skip("needs root: another user's files are made with chown")
    return entry.pw_uid, entry.pw_gid


def _events(logs: Path, name: str) -> list[EventRecord]:
    return [r for r in read_records(logs) if isinstance(r, EventRecord) and r.event == name]


def _status(home: Path) -> dict[str, object]:
    done = run_cli("status", "--json", "--home", str(home))
    return dict(json.loads(done.stdout))


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


# -- 1. never write through another user's link ------------------------------------------


def test_report_never_writes_through_another_users_symlink(
    start_daemon: Start, home: Path, tmp_path: Path
) -> None:
    """Root runs ``dflashd report`` in a shared 0777 directory where another user planted
    ``dflashd-report.html`` as a link to a root-only file: refused, the file untouched."""
    uid, gid = _nobody()
    daemon = start_daemon(child("exit_silent.py"))
    daemon.wait(60)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    victim = tmp_path / "root-only"
    victim.write_bytes(b"root's secret\n")
    victim.chmod(0o600)
    planted = shared / "dflashd-report.html"
    planted.symlink_to(victim)
    os.lchown(planted, uid, gid)
    done = run_cli("report", "--home", str(home), "-o", str(planted))
    assert done.returncode == 1
    assert "symlink owned by uid" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert victim.read_bytes() == b"root's secret\n"
    assert planted.is_symlink() and [p.name for p in shared.iterdir()] == [planted.name]
    # a plain path in the same directory is written whole, by rename (no temporary left)
    ok = run_cli("report", "--home", str(home), "-o", str(shared / "mine.html"))
    assert ok.returncode == 0, ok.stderr
    assert (shared / "mine.html").read_text().startswith("<!doctype html>")
    assert sorted(p.name for p in shared.iterdir()) == ["dflashd-report.html", "mine.html"]


def test_report_through_the_users_own_link_replaces_its_target_never_writes_into_it(
    start_daemon: Start, home: Path, tmp_path: Path
) -> None:
    daemon = start_daemon(child("exit_silent.py"))
    daemon.wait(60)
    target = tmp_path / "reports" / "latest.html"
    target.parent.mkdir()
    target.write_text("old")
    hard = tmp_path / "hardlink-of-target"
    os.link(target, hard)  # a second name of the old file: it must keep the old bytes
    link = tmp_path / "report.html"
    link.symlink_to(target)
    assert run_cli("report", "--home", str(home), "-o", str(link)).returncode == 0
    assert link.is_symlink() and target.read_text().startswith("<!doctype html>")
    assert hard.read_text() == "old"


def _plain_set(logs: Path, files: int) -> int:
    """A log set with ``files`` plain rotated files (no compression): the lines written."""
    writer = RotatingLogWriter(logs, max_bytes=16384, backups=200)
    pad = "x" * 150
    count = 0
    while writer.stats().rotations < files:
        writer.write_frame(1, "stdout", Frame([f"line {count} {pad}"], None, 170))
        count += 1
    writer.close()
    return count


def _finisher(logs_fd: int, daemon_pid: int, backups: int = 200) -> subprocess.Popen[bytes]:
    """The real finisher, as the daemon hands it over: the held directory passed as @FD."""
    home = zstd_home()
    assert home is not None
    argv = [sys.executable, "-I", "-S", str(SQUEEZE), "finish", "zstd", str(daemon_pid)]
    argv += [f"@{logs_fd}", "dflashd.jsonl", str(backups)]
    return subprocess.Popen(argv, pass_fds=(logs_fd,), env=helper_env(home))


def test_the_finisher_never_touches_an_archive_its_logs_directory_was_swapped_for(
    tmp_path: Path,
) -> None:
    """logs/ moved away and replaced by a link to an archive while the finisher waited for
    the daemon to go: the archive keeps every byte; the moved set is compressed whole."""
    logs = tmp_path / "home" / "logs"
    lines = _plain_set(logs, 6)
    archive = tmp_path / "archive"
    archive.mkdir()
    for n in range(1, 6):
        (archive / f"dflashd.jsonl.{n}").write_text(f"archived {n}\n")
    before = _tree(archive)
    daemon = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=-1)
    held = os.open(logs, os.O_RDONLY | os.O_DIRECTORY)
    try:
        finisher = _finisher(held, daemon.pid)
    finally:
        os.close(held)
    moved = tmp_path / "home" / "logs.moved"
    os.rename(logs, moved)
    logs.symlink_to(archive)
    assert daemon.stdin is not None
    daemon.stdin.close()  # the "daemon" exits: the finisher starts its work
    daemon.wait(10)
    assert finisher.wait(60) == 0
    assert _tree(archive) == before  # no .zst, no .part, no .rotate.lock, nothing deleted
    assert not [p for p in moved.iterdir() if re.fullmatch(r"dflashd\.jsonl\.\d+", p.name)]
    records = [r for r in read_records(moved) if isinstance(r, LineRecord)]
    assert len(records) == lines and [r.seq for r in records] == sorted({r.seq for r in records})


def test_a_logs_directory_swapped_by_its_owner_gets_no_rotation_lock(
    start_daemon: Start, home: Path, tmp_path: Path
) -> None:
    """Rotations with compression go on after the swap: the other directory gets nothing,
    not even the rotation lock the compression and the rotations share."""
    daemon = start_daemon(
        child("steps_then.py", "0.002", "100000000", "sleep"),
        logs={"max_bytes": 65536, "backups": 50, "compress": True},
    )
    daemon.wait_event("first_step")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    kept = home / "logs.kept"
    os.rename(home / "logs", kept)
    (home / "logs").symlink_to(theirs)
    rotations = len([p for p in kept.iterdir() if ".jsonl." in p.name])
    deadline = time.monotonic() + 60
    while len([p for p in kept.iterdir() if ".jsonl." in p.name]) < rotations + 3:
        assert time.monotonic() < deadline, "no rotation after the swap"
        time.sleep(0.1)  # the daemon's rotations are another process's: their files show it
    os.kill(daemon.proc.pid, signal.SIGTERM)
    assert daemon.wait(60) == 0
    assert list(theirs.iterdir()) == []
    assert _events(kept, "log_dir_replaced")


def test_a_home_swapped_by_another_user_gets_no_socket_and_status_refuses_it(
    start_daemon: Start, home: Path, tmp_path: Path
) -> None:
    """Another user who can write the home's parent swaps it for a link to a directory of
    theirs holding a planted state.json: the daemon binds nothing there, status refuses the
    link rather than show the planted state, and the daemon still stops on SIGTERM."""
    uid, gid = _nobody()
    daemon = start_daemon(STEPPING)
    daemon.wait_event("first_step")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    planted = {"state": "running", "run": 99, "child_pid": 1}
    (theirs / "state.json").write_text(json.dumps(planted))
    os.chown(theirs, uid, gid)
    moved = tmp_path / "moved-home"
    os.rename(home, moved)
    home.symlink_to(theirs)
    os.lchown(home, uid, gid)
    (moved / "control.sock").unlink()  # the daemon rebinds a missing socket within a second
    deadline = time.monotonic() + 30
    while not (moved / "control.sock").exists():
        assert time.monotonic() < deadline, "control.sock was never bound again"
        time.sleep(0.1)  # the daemon's own second-by-second check: its file shows it
    assert sorted(p.name for p in theirs.iterdir()) == ["state.json"]
    status = run_cli("status", "--home", str(home))
    assert status.returncode == 2 and "is a symlink" in status.stderr
    assert "99" not in status.stdout
    os.kill(daemon.proc.pid, signal.SIGTERM)
    assert daemon.wait(60) == 0
    assert sorted(p.name for p in theirs.iterdir()) == ["state.json"]  # nothing removed either
    assert "home_replaced" in [r.event for r in _events(moved / "logs", "home_replaced")]


# -- 2. never run what the user did not ask ------------------------------------------------


@pytest.mark.parametrize(
    "damage",
    [b"\x00garbage{", b"", b'{"command": "python train.py"}', b'{"command": [1, 2]}', None],
    ids=["garbage", "empty", "string-command", "wrong-types", "missing"],
)
def test_restart_on_a_damaged_record_of_the_last_start_launches_nothing(
    start_daemon: Start, home: Path, damage: bytes | None
) -> None:
    daemon = start_daemon(child("exit_silent.py"))
    daemon.wait(60)
    record = home / "invocation.json"
    assert record.is_file()
    if damage is None:
        record.unlink()
    else:
        record.write_bytes(damage)
    spawns = len(_events(home / "logs", "spawn"))
    done = run_cli("restart", "--home", str(home))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "invocation.json" in lines[0] and "dflashd restart --" in lines[0]
    assert not lock_is_held(home / "dflashd.lock")
    assert len(_events(home / "logs", "spawn")) == spawns
    # told what to run, it runs that (the damaged record is not needed)
    told = run_cli(
        "restart", "--home", str(home), "--no-wait", "--", *child("prints_then_waits.py")
    )
    assert told.returncode == 0, told.stderr
    assert len(_events(home / "logs", "spawn")) == spawns + 1
    run_cli("stop", "--home", str(home))


# -- 3. readers and reports that never lie -------------------------------------------------


def test_tail_while_the_finisher_compresses_sees_every_record_once_or_says_why(
    tmp_path: Path,
) -> None:
    logs = tmp_path / "logs"
    lines = _plain_set(logs, 60)
    daemon = subprocess.Popen([sys.executable, "-c", "pass"])
    daemon.wait()
    held = os.open(logs, os.O_RDONLY | os.O_DIRECTORY)
    try:
        finisher = _finisher(held, daemon.pid)
    finally:
        os.close(held)
    reads, silent = 0, 0
    try:
        while finisher.poll() is None or reads < 3:
            argv = dflashd_argv("tail", "--home", str(tmp_path), "-n", "1000000", "--json")
            done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
            reads += 1
            if done.returncode != 0:  # allowed only with its reason said
                assert "dflashd:" in done.stderr
                continue
            seqs = [json.loads(line)["seq"] for line in done.stdout.splitlines()]
            if seqs != list(range(1, lines + 1)):
                silent += 1
    finally:
        finisher.wait(60)
    assert silent == 0 and reads >= 3
    assert not [p for p in logs.iterdir() if re.fullmatch(r"dflashd\.jsonl\.\d+", p.name)]


def _goodput_headline(page: str) -> float:
    found = re.search(r"Goodput: ([\d.]+)% of", page)
    assert found is not None, "no goodput headline"
    return float(found.group(1))


def test_the_report_of_a_live_run_counts_it_up_to_now(
    start_daemon: Start, home: Path, tmp_path: Path
) -> None:
    daemon = start_daemon(STEPPING)
    daemon.wait_for(lambda r: isinstance(r, EventRecord) and r.event == "progress", 30)
    deadline = time.monotonic() + 30
    while (_status(home)["goodput"] or {}).get("productive_s", 0) < 3:  # type: ignore[union-attr]
        assert time.monotonic() < deadline
        time.sleep(0.2)  # the run's own pace: three seconds of steps
    out = tmp_path / "live.html"
    done = run_cli("report", "--home", str(home), "-o", str(out))
    assert done.returncode == 0, done.stderr
    page = out.read_text()
    status = _status(home)["goodput"]
    assert isinstance(status, dict)
    assert "Goodput: 0.0%" not in page and _goodput_headline(page) > 50
    assert abs(_goodput_headline(page) - 100 * float(status["ratio"])) < 15
    assert "<b>running</b>" in page and "no exit record" not in page  # its row: live


def test_goodput_totals_never_go_back_across_a_sigkilled_daemon(
    start_daemon: Start, home: Path
) -> None:
    """status shows totals; the daemon is SIGKILLed; a new daemon on the same home shows at
    least as much of each, the productive time it had not saved rebuilt from the log."""
    first = start_daemon(STEPPING)
    first.wait_event("first_step")
    deadline = time.monotonic() + 30
    shown: dict[str, object] = {}
    while float(shown.get("productive_s", 0) or 0) < 4:  # type: ignore[arg-type]
        assert time.monotonic() < deadline
        time.sleep(0.3)  # the run's own pace
        shown = dict(_status(home)["goodput"])  # type: ignore[arg-type]
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait(10)
    dead = _status(home)["goodput"]  # no daemon: state.json, as the dead one left it
    assert isinstance(dead, dict) and float(dead["productive_s"]) >= float(shown["productive_s"])  # type: ignore[arg-type]
    second = start_daemon(STEPPING)
    second.wait_for(lambda r: isinstance(r, EventRecord) and r.event == "spawn" and r.run == 2)
    again = dict(_status(home)["goodput"])  # type: ignore[arg-type]
    assert float(again["productive_s"]) >= float(shown["productive_s"])  # type: ignore[arg-type]
    for cause, seconds in dict(shown["lost_s"]).items():  # type: ignore[call-overload]
        assert float(again["lost_s"][cause]) >= float(seconds)  # type: ignore[index]
