"""dflashd under systemd's notify protocol, with a real datagram socket standing in for systemd."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from contextlib import closing
from pathlib import Path

from dflashd.logs import EventRecord, LineRecord, follow, read_records
from tests.conftest import child, dflashd_argv, run_cli, write_config


def listen(path: Path) -> socket.socket:
    """A datagram socket like systemd's NOTIFY_SOCKET."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(10)
    return sock


def under_systemd(tmp_path: Path, home: Path, *, watchdog_usec: str) -> subprocess.Popen[bytes]:
    """A foreground daemon whose NOTIFY_SOCKET is ``tmp_path/systemd.sock``, running a child
    that prints the notify socket it got, says READY and idles."""
    config = write_config(tmp_path / "c.toml", {"gpus": "none"})
    socket_path = str(tmp_path / "systemd.sock")
    env = {**os.environ, "NOTIFY_SOCKET": socket_path, "WATCHDOG_USEC": watchdog_usec}
    argv = dflashd_argv(
        "start",
        "--foreground",
        "--home",
        str(home),
        "--config",
        str(config),
        "--",
        *child("print_env.py"),
    )
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_ready_status_watchdog_and_the_child_never_sees_systemds_socket(tmp_path: Path) -> None:
    """READY=1 after the first launch, STATUS lines, WATCHDOG=1 at WATCHDOG_USEC/2; the child gets dflashd's socket."""
    home = tmp_path / "home"
    sd = listen(tmp_path / "systemd.sock")
    daemon = under_systemd(tmp_path, home, watchdog_usec="200000")
    try:
        messages: list[tuple[float, str]] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            data = sd.recv(4096).decode()
            messages.append((time.monotonic(), data))
            if "READY=1" in data:
                break
        ready_at = messages[-1][0]
        assert "READY=1" in messages[-1][1] and "STATUS=running run 1" in messages[-1][1]
        spawn = [
            r
            for r in read_records(home / "logs")
            if isinstance(r, EventRecord) and r.event == "launched"
        ]
        assert spawn, "READY came before the first launch was recorded"
        watchdogs = []
        while len(watchdogs) < 10:
            data = sd.recv(4096).decode()
            if data == "WATCHDOG=1":
                watchdogs.append(time.monotonic())
        interval = (watchdogs[-1] - watchdogs[0]) / (len(watchdogs) - 1)
        assert 0.05 < interval < 0.2, interval  # WATCHDOG_USEC/2 = 0.1 s
        assert watchdogs[0] >= ready_at - 1
        lines = [r.line for r in read_records(home / "logs") if isinstance(r, LineRecord)]
        assert f"child NOTIFY_SOCKET={home / 'notify.sock'}" in lines
        assert "child WATCHDOG_USEC=None" in lines
    finally:
        run_cli("stop", "--home", str(home), "--timeout", "2")
        daemon.wait(30)
        sd.close()


def test_nothing_is_sent_without_notify_socket(tmp_path: Path) -> None:
    """Without NOTIFY_SOCKET the daemon sends systemd nothing (the socket stays silent)."""
    home = tmp_path / "home"
    sd = listen(tmp_path / "systemd.sock")
    sd.settimeout(0.5)
    config = write_config(tmp_path / "c.toml", {"gpus": "none"})
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
    env["WATCHDOG_USEC"] = "100000"
    argv = dflashd_argv(
        "start",
        "--foreground",
        "--home",
        str(home),
        "--config",
        str(config),
        "--",
        *child("progress_then.py", "notify", "exit0"),
    )
    result = subprocess.run(argv, env=env, capture_output=True, timeout=60, check=False)
    assert result.returncode == 0
    try:
        data = sd.recv(4096)
    except TimeoutError:
        data = b""
    sd.close()
    assert data == b""


def test_a_systemd_that_reads_nothing_never_freezes_the_daemon(tmp_path: Path) -> None:
    """systemd's notify queue is full (a Unix datagram queue holds as few as 10 messages) and
    nobody reads it: the daemon drops its READY, STATUS and WATCHDOG messages instead of
    blocking in send, so the job runs, ``status`` answers and ``stop`` ends it at once."""
    home = tmp_path / "home"
    sd = listen(tmp_path / "systemd.sock")
    filler = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    filler.connect(str(tmp_path / "systemd.sock"))
    filler.setblocking(False)
    queued = 0
    try:
        while True:  # fill the queue until the kernel says it is full
            filler.send(b"X=1")
            queued += 1
    except BlockingIOError:
        pass
    assert queued > 0
    daemon = under_systemd(tmp_path, home, watchdog_usec="100000")
    try:
        deadline = time.monotonic() + 60
        records = follow(
            home / "logs", poll_s=0.02, should_stop=lambda: time.monotonic() > deadline
        )
        with closing(records):  # the first step in the log: the daemon runs its loop
            first = next(
                r for r in records if isinstance(r, EventRecord) and r.event == "first_step"
            )
        assert first is not None and daemon.poll() is None
        status = run_cli("status", "--json", "--home", str(home))
        assert status.returncode == 0 and json.loads(status.stdout)["state"] == "running"
        stopped = run_cli("stop", "--home", str(home), "--timeout", "2")
        assert stopped.returncode == 0, stopped.stderr
        assert daemon.wait(30) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(10)
        filler.close()
        sd.close()
