"""Issue 34: the terminal and the CLI as people used to journalctl, pm2 and tee expect them.

Real CLI, real daemons, real pipes and a real pseudo-terminal.
"""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
from pathlib import Path

from dflashd.logs import RotatingLogWriter
from dflashd.logs.framer import Frame
from tests.conftest import child, daemon_argv, dflashd_argv, run_cli, write_config

BAR = "import sys, time\nfor p in (10, 20, 30):\n    sys.stdout.write(f'{p}%\\r'); sys.stdout.flush(); time.sleep(0.05)\nprint('done')\n"


def test_ctrl_c_while_start_waits_leaves_the_job_running_and_exits_130(
    tmp_path: Path, home: Path
) -> None:
    config = write_config(tmp_path / "c.toml", {"gpus": "none", "start_wait_s": 120})
    argv = dflashd_argv("start", "--home", str(home), "--config", str(config), "--")
    argv += child("prints_then_waits.py")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # "dflashd: run 1 launched ...": now it waits
        assert "run 1 launched" in first
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, err
        assert "stopped waiting; run 1 keeps running (dflashd stop to end it)" in err
        assert "Aborted" not in err
        status = json.loads(run_cli("status", "--json", "--home", str(home)).stdout)
        assert status["state"] == "running" and status["child_pid"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        run_cli("stop", "--home", str(home))


def test_restart_on_a_home_that_never_ran_starts_nothing(tmp_path: Path) -> None:
    typo = tmp_path / "typo"
    result = run_cli("restart", "--home", str(typo))
    assert result.returncode == 2
    assert result.stderr.strip().endswith("nothing to restart (dflashd start)")
    assert len(result.stderr.strip().splitlines()) == 1
    assert not typo.exists()


def test_a_string_command_in_the_config_is_an_error_with_or_without_a_cli_command(
    tmp_path: Path, home: Path
) -> None:
    config = tmp_path / "c.toml"
    config.write_text('command = "python train.py"\ngpus = "none"\n')
    for cli_command in ([], ["--", "true"]):
        result = run_cli("start", "--home", str(home), "--config", str(config), *cli_command)
        assert result.returncode == 2
        assert "command: expected a list of strings, got the string 'python train.py'" in (
            result.stderr
        )
        assert "['python', 'train.py']" in result.stderr
    assert not (home / "logs").exists()


def _two_day_log(home: Path) -> None:
    clock = [1_800_000_000.0]  # 2027-01-15 08:00 UTC
    writer = RotatingLogWriter(home / "logs", clock=lambda: clock[0])
    for i in range(6):
        clock[0] = 1_800_000_000.0 + i * 36_000  # every 10 h: three dates
        writer.write_frame(1, "stdout", Frame([f"line {i}"], None, 7))
    writer.close()


def test_logs_is_tail_with_lines_until_and_dates_across_days(home: Path) -> None:
    _two_day_log(home)
    logs = run_cli("logs", "--home", str(home), "--lines", "3")
    tail = run_cli("tail", "--home", str(home), "-n", "3")
    assert logs.returncode == 0 and logs.stdout == tail.stdout
    shown = logs.stdout.splitlines()
    assert [line.split()[-1] for line in shown] == ["3", "4", "5"]
    assert shown[0].startswith("2027-01-16 14:00:00.000 r1")  # the lines span days: dated
    until = run_cli("tail", "--home", str(home), "--until", "2027-01-16T05:00:00Z", "-n", "9")
    assert [line.split()[-1] for line in until.stdout.splitlines()] == ["0", "1", "2"]
    same_day = run_cli("tail", "--home", str(home), "--until", "2027-01-15T09:00:00Z")
    assert same_day.stdout.startswith("08:00:00.000 r1")  # one day: times alone
    refused = run_cli("tail", "--home", str(home), "--until", "1h", "-f")
    assert refused.returncode == 2 and "--until and -f" in refused.stderr


def test_the_foreground_echo_keeps_a_bars_carriage_returns(tmp_path: Path, home: Path) -> None:
    config = write_config(tmp_path / "c.toml", {"gpus": "none"})
    job = [sys.executable, "-c", BAR]
    raw = subprocess.run(
        daemon_argv(home, config, job, flags=("--raw",)),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert raw.returncode == 0
    out = raw.stdout  # the launch lines may come between the job's first bytes and the rest
    assert b"10%\r" in out and b"20%\r30%\rdone\n" in out and b"10%\n" not in out
    # on a terminal the prefixed echo redraws in place too, as under tee
    main, sub = pty.openpty()
    proc = subprocess.Popen(
        daemon_argv(tmp_path / "home2", config, job, flags=()),
        stdout=sub,
        stderr=subprocess.DEVNULL,
    )
    os.close(sub)
    seen = b""
    while True:
        ready, _, _ = select.select([main], [], [], 30)
        if not ready:
            break
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the terminal's other end closed: the daemon is gone
            break
        if not chunk:
            break
        seen += chunk
    os.close(main)
    assert proc.wait(30) == 0
    assert b"| 20%\r" in seen and b"| 30%\r" in seen, seen  # no newline between redraws


def _run_true(home: Path, config: Path) -> subprocess.CompletedProcess[str]:
    """The foreground daemon running ``true`` to its end."""
    return subprocess.run(
        daemon_argv(home, config, ["true"]), capture_output=True, text=True, timeout=60, check=False
    )


def test_a_config_holding_the_webhook_warns_when_others_can_read_it(
    tmp_path: Path, home: Path
) -> None:
    config = write_config(
        tmp_path / "c.toml",
        {"gpus": "none"},
        alerts={"webhook_url": "http://127.0.0.1:9/services/SECRET"},
    )
    config.chmod(0o644)
    opened = _run_true(home, config)
    assert opened.returncode == 0
    warning = [line for line in opened.stderr.splitlines() if "readable by every user" in line]
    assert warning and "alerts.webhook_url" in warning[0] and "mode 0644" in warning[0]
    assert "SECRET" not in opened.stderr
    config.chmod(0o640)
    private = _run_true(home, config)
    assert private.returncode == 0 and "readable by every user" not in private.stderr


def test_the_service_steps_link_the_command_and_keep_the_secret_private() -> None:
    """The documented install makes `sudo -u dflashd dflashd` findable and the config 0640
    (a real systemd is not to be had here: this checks the steps as written)."""
    root = Path(__file__).parents[1]
    readme = (root / "README.md").read_text()
    assert "sudo ln -sf /opt/dflashd/bin/dflashd /usr/local/bin/dflashd" in readme
    assert "install -D -m 0640 -o root -g dflashd systemd/dflashd.toml.example" in readme
    assert "apt-get install python3-venv" in readme and "git archive HEAD" in readme
    assert "-m 0644" not in readme.split("## As a systemd service")[1].split("## ")[0]
    unit = (root / "systemd" / "dflashd.service").read_text()
    assert "/usr/local/bin/dflashd" in unit and "-m 0640 -o root -g dflashd" in unit
