"""Issue 21, parts 3 and 4: the daemon never dies of its clients, stray signals, a closed
stdout, a deleted socket or a broken alert sink.  Real daemons, real sockets, real signals."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from dflashd.logs import EventRecord, read_records
from dflashd.supervisor.host.procfs import read_stat
from dflashd.supervisor.speak.control import ControlError, request
from tests.conftest import Daemon, child, daemon_argv, run_cli, write_config

Start = Callable[..., Daemon]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _events(home: Path, name: str) -> list[EventRecord]:
    return [
        r for r in read_records(home / "logs") if isinstance(r, EventRecord) and r.event == name
    ]


def test_idle_metrics_connections_never_use_up_the_daemons_descriptors(
    home: Path, tmp_path: Path
) -> None:
    """200 idle TCP connections on metrics_listen, the daemon limited to 64 descriptors: the
    next relaunch happens, /metrics still answers, and nothing is recorded as daemon_error."""
    port = _free_port()
    trigger = tmp_path / "die"
    config = write_config(
        tmp_path / "c.toml",
        {"gpus": "none", "metrics_listen": f"127.0.0.1:{port}"},
        restart={"early_retries": 3, "backoff_initial_s": 0.0, "backoff_max_s": 1.0},
    )
    argv = daemon_argv(home)
    job = child("exit_on_file.py", str(trigger))
    proc = subprocess.Popen(
        ["prlimit", "--nofile=64:64", *argv, "--config", str(config), "--", *job],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    idle: list[socket.socket] = []
    try:
        daemon = Daemon.__new__(Daemon)  # only its log readers: the process is prlimit's
        daemon.home = home
        daemon.wait_event("launched", 30)
        for _ in range(200):
            conn = socket.socket()
            conn.settimeout(2)
            try:
                conn.connect(("127.0.0.1", port))
            except OSError:
                conn.close()
                continue
            idle.append(conn)
        trigger.write_text("now")
        daemon.wait_for(lambda r: getattr(r, "event", None) == "launched" and r.run == 2, 30)
        trigger.unlink()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            assert b"dflashd_up" in answer.read()
        assert proc.poll() is None
    finally:
        for conn in idle:
            conn.close()
        run_cli("stop", "--home", str(home), "--timeout", "2")
        proc.wait(30)
    assert _events(home, "fatal") == [] or all(
        e.fields.get("reason") != "daemon_error" for e in _events(home, "fatal")
    )
    assert _events(home, "daemon_exit")


def test_stray_signals_never_end_the_daemon(start_daemon: Start, home: Path) -> None:
    """SIGUSR1, SIGUSR2, SIGHUP, SIGALRM, SIGPWR, SIGXCPU (a soft CPU limit), SIGSTKFLT and
    real-time signals (each of which ends a process by default): the daemon and its job go
    on; USR1 and HUP dump the status into the daemon's own log, the others are noted by name."""
    daemon = start_daemon(child("prints_then_waits.py"))
    launched = daemon.wait_event("launched")
    strays = (signal.SIGUSR2, signal.SIGALRM, signal.SIGPWR, signal.SIGXCPU, signal.SIGSTKFLT)
    real_time = (signal.SIGRTMIN, signal.SIGRTMIN + 3, signal.SIGRTMAX)
    for signum in (signal.SIGUSR1, signal.SIGHUP, *strays, *real_time):
        os.kill(daemon.proc.pid, signum)
    status = json.loads(run_cli("status", "--json", "--home", str(home)).stdout)
    assert status["state"] == "running" and status["run"] == 1
    assert status["child_pid"] == launched.fields["pid"]
    assert run_cli("stop", "--home", str(home)).returncode == 0
    assert daemon.wait(30) == 0
    assert daemon.proc.stderr is not None
    err = daemon.proc.stderr.read()
    assert err.count("status_dump") == 2
    ignored = set(re.findall(r"signal_ignored signal=(\S+)", err))
    strays_named = {"SIGUSR2", "SIGALRM", "SIGPWR", "SIGXCPU", "SIGSTKFLT"}
    assert ignored == strays_named | {"SIGRTMIN", "SIGRTMIN+3", "SIGRTMAX"}
    assert [e.fields["verdict"] for e in daemon.events("exit")] == ["stopped"]


def test_a_closed_stdout_stops_the_echo_not_the_daemon(home: Path, tmp_path: Path) -> None:
    """start --foreground whose stdout reader is gone before the first line: the job runs to
    its end, and the log has every line and the exit record."""
    config = write_config(tmp_path / "c.toml", {"gpus": "none"})
    job = (
        "import time\nfor i in range(30):\n    print('step', i, flush=True)\n    time.sleep(0.02)\n"
    )
    argv = daemon_argv(home, config, flags=())
    reader_r, reader_w = os.pipe()
    os.close(reader_r)  # nobody will ever read: every write to it is EPIPE
    proc = subprocess.Popen([*argv, "--", "python3", "-c", job], stdout=reader_w)
    os.close(reader_w)
    assert proc.wait(60) == 0
    exits = _events(home, "exit")
    assert [e.fields["verdict"] for e in exits] == ["completed"]
    assert exits[0].fields["output_lines"] == 30


def test_many_concurrent_status_clients_are_all_answered(start_daemon: Start, home: Path) -> None:
    """100 threads, 2,000 status requests at once: every one answered."""
    daemon = start_daemon(child("prints_then_waits.py"))
    daemon.wait_event("launched")
    answered = 0
    lock = threading.Lock()
    failures: list[str] = []

    def client() -> None:
        nonlocal answered
        for _ in range(20):
            try:
                reply = request(home / "control.sock", {"cmd": "status"}, timeout_s=30)
            except ControlError as exc:
                failures.append(str(exc))
                continue
            with lock:
                answered += reply.get("state") == "running"

    threads = [threading.Thread(target=client) for _ in range(100)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert failures == [] and answered == 2000


def test_clients_that_never_read_do_not_hold_the_loop(start_daemon: Start, home: Path) -> None:
    """12 clients send status and never read the answer: a polite status is answered at once."""
    daemon = start_daemon(child("prints_then_waits.py"))
    daemon.wait_event("launched")
    rude = []
    for _ in range(12):
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        conn.connect(str(home / "control.sock"))
        conn.sendall(b'{"cmd": "status"}\n')
        rude.append(conn)
    try:
        started = time.monotonic()
        reply = request(home / "control.sock", {"cmd": "status"}, timeout_s=10)
        assert reply["state"] == "running" and time.monotonic() - started < 1.0
    finally:
        for conn in rude:
            conn.close()


def test_a_deleted_control_socket_still_lets_stop_stop(start_daemon: Start, home: Path) -> None:
    """control.sock removed by hand: stop still ends the job and the daemon."""
    daemon = start_daemon(child("prints_then_waits.py"))
    daemon.wait_event("launched")
    (home / "control.sock").unlink()
    result = run_cli("stop", "--home", str(home))
    assert result.returncode == 0, result.stderr
    assert daemon.wait(30) == 0
    assert [e.fields["verdict"] for e in daemon.events("exit")] == ["stopped"]


# -- 4. alerts: one bad sink never silences the others ---------------------------------------


@contextmanager
def _tcp_server(answer: Callable[[socket.socket, threading.Event], None]) -> Iterator[int]:
    """A loopback TCP port whose every connection is handed to ``answer`` on a thread."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            threading.Thread(target=answer, args=(conn, stop), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(server.getsockname()[1])
    finally:
        stop.set()
        thread.join(2)
        server.close()


@pytest.fixture
def banner_server() -> Iterator[int]:
    """A TCP port that answers every connection with an SSH banner (not HTTP)."""

    def banner(conn: socket.socket, _stop: threading.Event) -> None:
        with conn:
            conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")

    with _tcp_server(banner) as port:
        yield port


@pytest.fixture
def trickle_server() -> Iterator[int]:
    """A TCP port that answers with one byte a second, forever."""

    def trickle(conn: socket.socket, stop: threading.Event) -> None:
        with conn:
            while not stop.wait(1.0):
                try:
                    conn.sendall(b"H")
                except OSError:
                    return

    with _tcp_server(trickle) as port:
        yield port


def _alerts_config(tmp_path: Path, webhook: str, marker: Path) -> dict[str, object]:
    command = [
        "python3",
        "-c",
        f"import sys; open({str(marker)!r}, 'a').write(sys.stdin.read()[:20] + '\\n')",
    ]
    return {"webhook_url": webhook, "command": command}


@pytest.mark.parametrize("kind", ["banner", "trickle"])
def test_a_broken_webhook_never_silences_the_command(
    start_daemon: Start, tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    """An SSH banner or a one-byte-a-second endpoint: every alert still reaches the command,
    the webhook fails within its deadline, and each failure is recorded."""
    port = request.getfixturevalue(f"{kind}_server")
    marker = tmp_path / "alerts.txt"
    daemon = start_daemon(
        child("crash_early.py"),
        restart={"early_retries": 1},
        alerts=_alerts_config(tmp_path, f"http://127.0.0.1:{port}/hook", marker),
    )
    started = time.monotonic()
    assert daemon.wait(90) == 4
    delivered = [e for e in daemon.events("alert") if e.fields.get("sink") == "command"]
    failed = [e for e in daemon.events("alert") if e.fields.get("sink") == "webhook"]
    assert delivered and all(e.fields["ok"] for e in delivered)
    assert marker.read_text().count("\n") == len(delivered) == 2  # the early death and the fatal
    assert failed and not any(e.fields["ok"] for e in failed)
    assert time.monotonic() - started < 60


def test_a_hung_alert_command_is_waited_for_then_ended(start_daemon: Start, tmp_path: Path) -> None:
    """The alert command hangs: the daemon waits for it (its session is not swept with the
    job), ends it at the bound, and exits; nothing of it outlives the daemon."""
    pidfile = tmp_path / "alert.pid"
    hang = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
    daemon = start_daemon(
        child("crash_early.py"),
        restart={"early_retries": 0},
        alerts={"command": ["python3", "-c", hang]},
    )
    assert daemon.wait(90) == 4
    pid = int(pidfile.read_text())
    found = read_stat(pid)
    assert found is None or found.state == "Z"
    outcomes = [e for e in daemon.events("alert") if e.fields.get("sink") == "command"]
    assert outcomes and "ended" in str(outcomes[-1].fields.get("detail"))


def test_a_daemon_killed_as_it_launches_leaves_its_state_never_nothing(
    home: Path, tmp_path: Path
) -> None:
    """SIGKILL the moment the first launch is said: status shows the daemon's last state and
    says it is gone without an end (its state.json is written before the launch), where it
    used to say "nothing recorded" while the log held the run's spawn."""
    config = write_config(tmp_path / "c.toml", {"gpus": "none"})
    proc = subprocess.Popen(
        daemon_argv(home, config, child("prints_then_waits.py")),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    assert "launched" in proc.stderr.readline()  # the first line it says is the launch
    proc.kill()
    proc.wait(30)
    proc.stderr.close()
    shown = run_cli("status", "--json", "--home", str(home))
    assert shown.returncode == 3, shown
    status = json.loads(shown.stdout)
    assert status["state"] in ("starting", "running"), status
    assert "gone without recording an end" in status.get("state_note", ""), status
    said = [r for r in read_records(home / "logs") if isinstance(r, EventRecord)]
    assert any(r.event == "spawn" for r in said)  # written before the fork, whatever follows
