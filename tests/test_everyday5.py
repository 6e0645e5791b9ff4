"""Issue 54: everyday paths IV, as a user types them (the real CLI, real daemons and jobs).

``restart`` replays the start's environment (pm2's habit), never prints it, takes the caller's
with ``--env-from-shell``, and never stops a healthy run for a restart that cannot launch.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

from tests.conftest import dflashd_argv, run_cli, write_config

SECRET = "hunter2-do-not-print"


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        dflashd_argv(*args), env=env, capture_output=True, text=True, timeout=120, check=False
    )


def _job(tmp_path: Path) -> Path:
    """A command found only on a private PATH entry (a venv's bin, say) that says its STEPS."""
    bin_dir = tmp_path / "venv-bin"
    bin_dir.mkdir()
    job = bin_dir / "trainjob"
    job.write_text('#!/bin/sh\necho "step 1 STEPS=$STEPS"\nexec sleep 100000\n')
    job.chmod(0o755)
    return bin_dir


def _said(home: Path, run: int) -> str:
    out = run_cli("tail", "--home", str(home), "--run", str(run), "-n", "50").stdout
    return next((line for line in out.splitlines() if "STEPS=" in line), out)


def test_restart_replays_the_starts_environment_and_never_prints_it(
    tmp_path: Path, home: Path
) -> None:
    bin_dir = _job(tmp_path)
    config = write_config(tmp_path / "c.toml", {"gpus": "none"})
    started = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STEPS": "3000"}
    started["API_TOKEN"] = SECRET
    bare = {k: v for k, v in os.environ.items() if k not in ("STEPS", "API_TOKEN")}
    try:
        first = _cli(started, "start", "--home", str(home), "--config", str(config), "trainjob")
        assert first.returncode == 0, first.stderr
        saved = home / "environment.json"
        assert stat.S_IMODE(saved.stat().st_mode) == 0o600
        # another shell: no STEPS, and the venv's bin not on its PATH
        again = _cli(bare, "restart", "--home", str(home))
        assert again.returncode == 0, again.stdout + again.stderr
        assert "run 2 is training" in again.stdout
        assert "STEPS=3000" in _said(home, 2)
        shown = "".join(
            run_cli(*args, "--home", str(home)).stdout
            for args in (("status",), ("status", "--json"), ("tail", "-n", "200"))
        )
        assert SECRET not in shown + again.stdout + again.stderr
        # --env-from-shell: the caller's, here with the venv's bin and STEPS=7
        mine = {**bare, "PATH": started["PATH"], "STEPS": "7"}
        third = _cli(mine, "restart", "--home", str(home), "--env-from-shell")
        assert third.returncode == 0, third.stderr
        assert "STEPS=7" in _said(home, 3)
        assert json.loads(saved.read_text())["environ"]["STEPS"] == "7"  # the newest start's
    finally:
        run_cli("stop", "--home", str(home))


def test_a_restart_that_cannot_launch_stops_nothing(tmp_path: Path, home: Path) -> None:
    bin_dir = _job(tmp_path)
    config = write_config(tmp_path / "c.toml", {"gpus": "none"})
    started = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    bare = dict(os.environ)
    try:
        first = _cli(started, "start", "--home", str(home), "--config", str(config), "trainjob")
        assert first.returncode == 0, first.stderr
        before = json.loads(run_cli("status", "--json", "--home", str(home)).stdout)
        # this shell's PATH has no trainjob: refused, one line, the healthy run left alone
        refused = _cli(bare, "restart", "--home", str(home), "--env-from-shell")
        assert refused.returncode == 2, refused.stderr
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1 and "'trainjob' is not a command on the job's PATH" in lines[0]
        assert "nothing was stopped" in lines[0]
        # the file gone from the start's PATH too: refused as well
        (bin_dir / "trainjob").rename(tmp_path / "moved")
        gone = _cli(bare, "restart", "--home", str(home))
        assert gone.returncode == 2 and "with the last start's environment" in gone.stderr
        after = json.loads(run_cli("status", "--json", "--home", str(home)).stdout)
        assert after["state"] == "running" and after["run"] == before["run"] == 1
        assert after["child_pid"] == before["child_pid"]
    finally:
        run_cli("stop", "--home", str(home))
