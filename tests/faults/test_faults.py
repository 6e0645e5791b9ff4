"""The fault suite of issue 13: each case, with real processes, real links, real limits.

Every test names the case it covers.  They failed on dflashd 0.1 and pass now.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path

import psutil
import pytest

from dflashd.logs import EventRecord, LineRecord, follow, read_records
from dflashd.supervisor.host.groups import HostProcesses
from dflashd.supervisor.host.home import Home
from dflashd.supervisor.host.procfs import read_stat
from dflashd.supervisor.host.recovery import boot_id
from tests.conftest import Daemon, child, daemon_argv, run_cli, write_config
from tests.faults.conftest import fill

Start = Callable[..., Daemon]


@pytest.fixture
def stranger() -> Iterator[subprocess.Popen[bytes]]:
    """A real process dflashd did not start, leading its own process group as a reused pid would
    (this test's own child; ended by pid)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True
    )
    yield proc
    proc.kill()
    proc.wait()


def _wait_for_event(home: Path, name: str, timeout: float = 20) -> None:
    """Follow the run log until a dflashd record named ``name`` appears (bounded)."""
    deadline = time.monotonic() + timeout
    stream = follow(home / "logs", poll_s=0.02, should_stop=lambda: time.monotonic() > deadline)
    with closing(stream):
        for record in stream:
            if isinstance(record, EventRecord) and record.event == name:
                return
    raise AssertionError(f"no {name} record within {timeout}s")


def _state(home: Path, **fields: object) -> None:
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    (home / "state.json").write_text(json.dumps(fields))


# -- 1. recovery never kills a process it cannot prove is ours ------------------------------


def test_1_reused_pid_is_never_killed(
    start_daemon: Start, home: Path, stranger: subprocess.Popen[bytes]
) -> None:
    """state.json names a live pid with the same create time and boot, but no DFLASHD mark: untouched."""
    created = psutil.Process(stranger.pid).create_time()
    child_rec = {"pid": stranger.pid, "create_time": created, "boot_id": boot_id()}
    _state(home, state="running", run=3, child=child_rec)
    daemon = start_daemon(child("exit_silent.py"), restart={"early_retries": 0})
    assert daemon.wait() == 4
    assert stranger.poll() is None and psutil.Process(stranger.pid).is_running()
    refused = daemon.events("orphan_not_ours")[0]
    assert "DFLASHD_HOME_ID" in refused.fields["refused"][str(stranger.pid)]
    assert daemon.events("recovered_orphan") == []


def test_1_other_boot_is_never_ours(
    start_daemon: Start, home: Path, stranger: subprocess.Popen[bytes]
) -> None:
    """A pid recorded in another boot: nothing is touched."""
    created = psutil.Process(stranger.pid).create_time()
    _state(
        home,
        state="running",
        run=3,
        child={"pid": stranger.pid, "create_time": created, "boot_id": "x"},
    )
    daemon = start_daemon(child("exit_silent.py"), restart={"early_retries": 0})
    daemon.wait()
    assert stranger.poll() is None
    assert "rebooted" in daemon.events("orphan_not_ours")[0].fields["note"]


def test_1_a_proven_leftover_is_ended(start_daemon: Start, home: Path) -> None:
    """A leftover carrying this home's id and DFLASHD_RUN, created when recorded: ended."""
    Home(home).create()
    env = {**os.environ, "DFLASHD_HOME_ID": Home(home).id, "DFLASHD_RUN": "3"}
    leftover = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], env=env, start_new_session=True
    )
    try:
        created = psutil.Process(leftover.pid).create_time()
        child_rec = {"pid": leftover.pid, "create_time": created, "boot_id": boot_id()}
        _state(home, state="running", run=3, child=child_rec)
        daemon = start_daemon(child("exit_silent.py"), restart={"early_retries": 0})
        daemon.wait()
        assert leftover.wait(10) is not None
        assert daemon.events("recovered_orphan")[0].fields["pids"] == [leftover.pid]
    finally:
        if leftover.poll() is None:
            leftover.kill()
            leftover.wait()


def test_1_the_recorded_create_time_is_psutils() -> None:
    """The create time a launch records (state.json's, the next daemon's proof) is read from
    ``/proc`` without psutil's import, and is psutil's own figure for the same process."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        recorded = HostProcesses("").create_time(other.pid)
        assert recorded is not None
        assert abs(recorded - psutil.Process(other.pid).create_time()) < 1e-6
    finally:
        other.kill()
        other.wait()
    assert HostProcesses("").create_time(other.pid) is None  # reaped: gone, not a guess


@pytest.mark.parametrize("ticks_off", [0, 1])
def test_1_a_leftover_is_proven_by_its_start_ticks_across_a_clock_step(
    start_daemon: Start, home: Path, ticks_off: int
) -> None:
    """state.json's create time is 2 s off, as a step of the wall clock between the two daemons
    leaves it (``/proc/stat``'s boot time moves with the clock): the start ticks since boot
    still prove the leftover (ended); a tick off, the same pid is another process (untouched)."""
    Home(home).create()
    env = {**os.environ, "DFLASHD_HOME_ID": Home(home).id, "DFLASHD_RUN": "3"}
    leftover = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], env=env, start_new_session=True
    )
    try:
        found = read_stat(leftover.pid)
        assert found is not None
        stepped = psutil.Process(leftover.pid).create_time() + 2.0
        child_rec = {
            "pid": leftover.pid,
            "create_time": stepped,
            "start_ticks": found.start_ticks + ticks_off,
            "boot_id": boot_id(),
        }
        _state(home, state="running", run=3, child=child_rec)
        daemon = start_daemon(child("exit_silent.py"), restart={"early_retries": 0})
        daemon.wait()
        if ticks_off == 0:
            assert leftover.wait(10) is not None
            assert daemon.events("recovered_orphan")[0].fields["pids"] == [leftover.pid]
        else:
            assert leftover.poll() is None
            refused = daemon.events("orphan_not_ours")[0].fields["refused"]
            assert "start time differs" in refused[str(leftover.pid)]
            assert daemon.events("recovered_orphan") == []
    finally:
        if leftover.poll() is None:
            leftover.kill()
            leftover.wait()


# -- 2. links and loose permissions in the home ---------------------------------------------


@pytest.mark.parametrize("name", ["logs/dflashd.jsonl", "dflashd.lock", "daemon.log"])
def test_2_planted_symlink_is_never_followed(home: Path, tmp_path: Path, name: str) -> None:
    """A link at a home file: start refuses with one line (exit 2); the target is untouched."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (home / "logs").mkdir(mode=0o700, parents=True)
    (home / name).symlink_to(victim)
    config = write_config(tmp_path / "c.toml", {"gpus": "none"})
    result = run_cli(
        "start", "--home", str(home), "--config", str(config), "--", *child("exit_silent.py")
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1
    assert victim.read_text() == "precious\n"


def test_2_loose_home_is_refused_and_never_chmodded(tmp_path: Path) -> None:
    """An existing 1777 directory as home: refused with a clear message, its mode unchanged."""
    loose = tmp_path / "shared"
    loose.mkdir()
    loose.chmod(0o1777)
    config = write_config(tmp_path / "c.toml", {"gpus": "none"})
    result = run_cli(
        "start", "--home", str(loose), "--config", str(config), "--", *child("exit_silent.py")
    )
    assert result.returncode == 2 and "writable by group or others" in result.stderr
    assert loose.stat().st_mode & 0o7777 == 0o1777


# -- 3. terminal escapes ---------------------------------------------------------------------


def test_3_tail_shows_control_characters_escaped(start_daemon: Start, home: Path) -> None:
    """Text tail escapes ESC and BEL; --raw and --json keep the bytes."""
    daemon = start_daemon(child("escapes.py"))
    daemon.wait()
    text = run_cli("tail", "--home", str(home), "--src", "stdout").stdout
    assert "\x1b" not in text and "\x07" not in text
    assert "\\x1b]0;pwned title\\x07" in text
    raw = run_cli("tail", "--home", str(home), "--src", "stdout", "--raw").stdout
    assert "\x1b]0;pwned title\x07" in raw


# -- 4. a full disk when a run ends -----------------------------------------------------------


def test_4_full_disk_at_the_end_of_a_run(tmp_path: Path, small_disk: Path) -> None:
    """The home on a tmpfs that fills while the job runs: the daemon reaches its fatal, no traceback."""
    mnt = small_disk
    home, full = mnt / "home", tmp_path / "disk_is_full"
    job = (
        "import os, sys, threading\n"
        "print('working', flush=True)\n"
        f"while not os.path.exists({str(full)!r}): threading.Event().wait(0.05)\n"
        "sys.exit(1)\n"
    )
    config = write_config(
        tmp_path / "c.toml",
        {"gpus": "none"},
        restart={"early_retries": 1, "backoff_initial_s": 0.0, "backoff_max_s": 1.0},
    )
    argv = daemon_argv(home)
    proc = subprocess.Popen(
        [*argv, "--config", str(config), "--", sys.executable, "-c", job],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _wait_for_event(home, "launched")  # runs.sqlite, state.json and the log are open by then
    fill(mnt / "filler")
    full.write_text("now")  # the job may end: runs.sqlite, state.json and the log are full
    assert proc.wait(60) == 4
    assert proc.stderr is not None
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert "Traceback" not in err and "history_write_failed" in err


# -- 5. the control socket under load ------------------------------------------------------


def test_5_idle_connections_and_a_small_fd_limit(home: Path, tmp_path: Path) -> None:
    """200 idle clients against a daemon limited to 64 fds: it stays up and still answers status."""
    config = write_config(tmp_path / "c.toml", {"gpus": "none"})
    argv = daemon_argv(home, config)
    proc = subprocess.Popen(
        ["prlimit", "--nofile=64:64", *argv, "--", *child("prints_then_waits.py")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    clients: list[socket.socket] = []
    try:
        sock_path = home / "control.sock"
        _wait_for_event(home, "launched")  # the control socket is bound before the launch
        for _ in range(200):
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                client.connect(str(sock_path))
            except OSError:
                client.close()
                continue
            clients.append(client)
        status = run_cli("status", "--home", str(home), "--json", timeout=30)
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["state"] == "running"
    finally:
        for client in clients:
            client.close()
        run_cli("stop", "--home", str(home), "--timeout", "2")
        proc.wait(30)
    records = list(read_records(home / "logs"))
    assert any(isinstance(r, EventRecord) and r.event == "exit" for r in records)


# -- 6. an absurd stop timeout -------------------------------------------------------------------


def test_6_huge_stop_timeout_is_refused_not_fatal(start_daemon: Start, home: Path) -> None:
    """--timeout 1e308 is a usage error; the same over the socket is refused; the daemon lives on."""
    from dflashd.supervisor.speak.control import request

    daemon = start_daemon(child("prints_then_waits.py"))
    daemon.wait_event("launched")
    cli = run_cli("stop", "--home", str(home), "--timeout", "1e308")
    assert cli.returncode == 2 and "Traceback" not in cli.stderr
    reply = request(home / "control.sock", {"cmd": "stop", "timeout_s": 1e308})
    assert reply["ok"] is False and "timeout_s" in reply["error"]
    assert daemon.proc.poll() is None
    assert run_cli("stop", "--home", str(home), "--timeout", "2").returncode == 0


# -- 7. hostile state and home -------------------------------------------------------------------


@pytest.mark.parametrize(
    "state",
    [{"restarts_by_verdict": 5}, {"child": {"pid": "x"}}, {"last_exit": "oops"}, {"run": "seven"}],
)
def test_7_state_json_of_the_wrong_shape(
    start_daemon: Start, home: Path, state: dict[str, object]
) -> None:
    """Valid JSON, wrong types: status shows what it can, start works."""
    _state(home, **state)
    status = run_cli("status", "--home", str(home))
    assert "Traceback" not in status.stderr and status.returncode == 3
    daemon = start_daemon(child("exit_silent.py"), restart={"early_retries": 0})
    assert daemon.wait() == 4


def test_7_directory_where_files_belong_and_a_home_under_a_file(home: Path, tmp_path: Path) -> None:
    """A directory at dflashd.lock / control.sock, a home below a regular file: one-line answers."""
    (home / "dflashd.lock").mkdir(parents=True)
    (home / "control.sock").mkdir()
    home.chmod(0o700)
    for args in (["status"], ["stop"], ["tail"]):
        result = run_cli(*args, "--home", str(home))
        assert "Traceback" not in result.stderr, result.stderr
    blocker = tmp_path / "file"
    blocker.write_text("x")
    config = write_config(tmp_path / "c.toml", {"gpus": "none"})
    for args in (["status"], ["stop"], ["start", "--config", str(config)]):
        result = run_cli(*args, "--home", str(blocker / "home"))
        assert "Traceback" not in result.stderr, result.stderr
        assert result.returncode != 0 or args == ["stop"]


# -- 8, 9. the log: ordering and the size bound ------------------------------------------------


def test_8_exit_record_follows_every_line_of_a_fast_writer(start_daemon: Start) -> None:
    """40 MB written fast, then exit: every line precedes the exit record, none split, count exact."""
    count = 500_000
    daemon = start_daemon(child("flood_and_exit.py", str(count)), logs={"max_bytes": 1 << 30})
    assert daemon.wait(120) == 0
    records = daemon.records()
    exit_index = next(
        i for i, r in enumerate(records) if isinstance(r, EventRecord) and r.event == "exit"
    )
    lines = [r for r in records if isinstance(r, LineRecord)]
    assert len(lines) == count and not any(r.partial for r in lines)
    assert all(isinstance(r, EventRecord) for r in records[exit_index + 1 :])
    assert records[exit_index].fields["output_lines"] == count  # type: ignore[union-attr]


def test_9_files_stay_within_one_record_of_max_bytes(start_daemon: Start, home: Path) -> None:
    """max_bytes = 65536 with a fast writer: no file over the bound by more than one record."""
    daemon = start_daemon(
        child("flood_and_exit.py", "50000"), logs={"max_bytes": 65536, "backups": 100}
    )
    assert daemon.wait(60) == 0
    sizes = []
    for path in (home / "logs").iterdir():  # the finisher may still be compressing: files come
        try:  # and go (a .part becomes a .zst, a plain file its packed twin)
            sizes.append(path.stat().st_size)
        except FileNotFoundError:
            continue
    assert sizes and max(sizes) <= 65536 + 200


# -- 10. the live log deleted under the daemon -----------------------------------------------


def test_10_deleted_live_log_loses_nothing(start_daemon: Start, home: Path, tmp_path: Path) -> None:
    """rm of the live log mid-run: every later line is in the new file, nothing dropped uncounted."""
    marker = tmp_path / "go"
    daemon = start_daemon(child("two_phases.py", str(marker)))
    daemon.wait_for(lambda r: isinstance(r, LineRecord) and r.line == "phase one")
    (home / "logs" / "dflashd.jsonl").unlink()
    marker.write_text("go")
    assert daemon.wait() == 0
    lines = [r.line for r in daemon.records() if isinstance(r, LineRecord)]
    assert lines == [f"phase two {i}" for i in range(100)]
    assert daemon.events("log_dropped") == []
    assert daemon.events("exit")[0].fields["verdict"] == "completed"


# -- 11. a daemon killed outright ------------------------------------------------------------------


def test_11_run_of_a_killed_daemon_gets_an_exit_record(start_daemon: Start, home: Path) -> None:
    """SIGKILL the daemon mid-run: the next daemon writes run 1's exit record (verdict lost)."""
    first = start_daemon(child("prints_then_waits.py"))
    first.wait_event("launched")
    deadline = time.monotonic() + 10
    state = home / "state.json"
    while not state.exists() or "child" not in json.loads(state.read_text() or "{}"):
        assert time.monotonic() < deadline  # state.json (written right after the launch) is
        time.sleep(0.02)  # the daemon's only record of its child, and a file has no event
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(10)
    second = start_daemon(child("exit_silent.py"), restart={"early_retries": 0})
    second.wait()
    exits = {r.run: r.fields for r in second.events("exit")}
    assert exits[1]["verdict"] == "lost" and exits[1]["reason"] == "daemon_killed"


# -- 12. a stopped child that stalls ---------------------------------------------------------------


def test_12_sigstopped_child_still_dumps_its_stack(start_daemon: Start) -> None:
    """A SIGSTOPped job past its first-step timeout gets SIGABRT then SIGCONT: the stack is logged."""
    daemon = start_daemon(
        child("stops_itself.py"),
        first_step_pattern="^step ",
        first_step_timeout_s=1.0,
        restart={"early_retries": 0},
    )
    assert daemon.wait(30) == 4
    assert "frozen_in_a_debugger" in daemon.stacks_text()  # py-spy reads a stopped process too


# -- 13, 14. bad values refused at start ------------------------------------------------------------


def test_13_webhook_that_is_not_http_is_refused_and_never_printed(
    home: Path, tmp_path: Path
) -> None:
    """A file:// webhook: exit 2, nothing launched, the URL's path nowhere in the output."""
    secret = "file:///tmp/T0KEN-SECRET"
    config = write_config(tmp_path / "c.toml", {"gpus": "none"}, alerts={"webhook_url": secret})
    result = run_cli(
        "start", "--home", str(home), "--config", str(config), "--", *child("exit_silent.py")
    )
    assert result.returncode == 2 and "webhook_url" in result.stderr
    assert "T0KEN" not in result.stdout + result.stderr
    assert not (home / "logs" / "dflashd.jsonl").exists()


def test_14_busy_metrics_listen_refuses_the_start(home: Path, tmp_path: Path) -> None:
    """metrics_listen on a port already taken: exit 2 naming it, and nothing launched."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = write_config(
            tmp_path / "c.toml", {"gpus": "none", "metrics_listen": f"127.0.0.1:{port}"}
        )
        result = run_cli(
            "start", "--home", str(home), "--config", str(config), "--", *child("exit_silent.py")
        )
    assert result.returncode == 2 and f"metrics_listen 127.0.0.1:{port}" in result.stderr
    spawned = [
        r for r in read_records(home / "logs") if isinstance(r, EventRecord) and r.event == "spawn"
    ]
    assert spawned == []
    # issue 31: the refused start leaves status as it was (no phantom "starting" state)
    assert not (home / "state.json").exists()
    status = run_cli("status", "--home", str(home), "--json")
    assert status.returncode == 3 and '"starting"' not in status.stdout
