"""Issue 23: the everyday paths as a new user walks them, with real processes and the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import dflashd_argv, run_cli, write_config


def _run_in(cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        dflashd_argv(*args), cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_start_on_an_import_error_after_import_torch_exits_4_with_the_traceback(
    tmp_path: Path, home: Path
) -> None:
    config = write_config(tmp_path / "c.toml", {"gpus": "none"})
    job = "import torch\nimport missing_module\n"
    try:
        result = run_cli(
            "start", "--home", str(home), "--config", str(config), "--", sys.executable, "-c", job
        )
        assert result.returncode == 4, result.stdout + result.stderr
        assert "ModuleNotFoundError: No module named 'missing_module'" in result.stderr
        assert "is running" not in result.stdout
    finally:
        run_cli("stop", "--home", str(home))


def test_a_mistyped_option_is_refused_and_nothing_launches(tmp_path: Path, home: Path) -> None:
    for typo in (["--foregroud"], ["-d"], ["--detach"]):
        result = run_cli("start", "--home", str(home), *typo, "--", "python3", "train.py")
        assert result.returncode == 2, (typo, result.stderr)
        assert "No such option" in result.stderr
        assert not (home / "logs").exists() and not (home / "invocation.json").exists()
    assert "Did you mean '--foreground'" in run_cli("start", "--foregroud").stderr
    # -c is --config since issue 44: a missing file is one line, and nothing launches either
    missing = run_cli("start", "--home", str(home), "-c", "x.toml", "--", "python3", "train.py")
    assert missing.returncode == 2 and "config file not found: x.toml" in missing.stderr
    assert not (home / "logs").exists()


def test_restart_from_another_directory_runs_where_start_ran(tmp_path: Path, home: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(
        "import os, threading\nprint('step 1 in', os.getcwd(), flush=True)\nthreading.Event().wait()\n"
    )
    write_config(project / "c.toml", {"gpus": "none"})
    try:
        first = _run_in(
            project, "start", "--home", str(home), "--config", "c.toml", "--", "python3", "train.py"
        )
        assert first.returncode == 0, first.stderr
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        again = _run_in(elsewhere, "restart", "--home", str(home))
        assert again.returncode == 0, again.stderr
        assert "run 2 is training" in again.stdout
        status = json.loads(run_cli("status", "--json", "--home", str(home)).stdout)
        assert status["run"] == 2 and status["cwd"] == str(project.resolve())
        assert status["state"] == "running"
        shown = run_cli("status", "--home", str(home)).stdout
        assert f"cwd         {project.resolve()}" in shown
    finally:
        run_cli("stop", "--home", str(home))


def test_no_wait_returns_at_once_and_already_running_says_what_to_do(
    tmp_path: Path, home: Path
) -> None:
    config = write_config(tmp_path / "c.toml", {"gpus": "none", "start_wait_s": 60.0})
    try:
        quiet = run_cli(
            "start", "--home", str(home), "--config", str(config), "--no-wait", "--", "sleep", "60"
        )
        assert quiet.returncode == 0 and "launched" in quiet.stdout
        assert "is running" not in quiet.stdout  # it did not wait the 60 s for a step
        again = run_cli("start", "--home", str(home), "--", "sleep", "60")
        assert again.returncode == 1 and "dflashd status" in again.stderr
    finally:
        run_cli("stop", "--home", str(home))


def test_a_job_with_no_step_is_reported_running_after_the_wait(tmp_path: Path, home: Path) -> None:
    config = write_config(tmp_path / "c.toml", {"gpus": "none", "start_wait_s": 1.5})
    job = "import threading\nprint('loading shards', flush=True)\nthreading.Event().wait()\n"
    try:
        result = run_cli(
            "start", "--home", str(home), "--config", str(config), "--", sys.executable, "-c", job
        )
        assert result.returncode == 0
        assert "no step seen in 1.5s (last line: loading shards)" in result.stdout
    finally:
        run_cli("stop", "--home", str(home))


def test_the_spawn_record_names_the_absolute_cwd(tmp_path: Path, home: Path) -> None:
    write_config(tmp_path / "c.toml", {"gpus": "none", "cwd": "."})
    result = _run_in(
        tmp_path,
        "start",
        "--foreground",
        "--quiet",
        "--home",
        str(home),
        "--config",
        "c.toml",
        "--",
        "true",
    )
    assert result.returncode == 0
    spawn = next(
        json.loads(line)
        for line in (home / "logs" / "dflashd.jsonl").read_text().splitlines()
        if '"event":"spawn"' in line
    )
    assert spawn["cwd"] == str(tmp_path.resolve()) and os.path.isabs(spawn["cwd"])


def test_report_refuses_a_format_it_does_not_write(tmp_path: Path, home: Path) -> None:
    result = run_cli("report", "--home", str(home), "-o", str(tmp_path / "x.png"))
    assert result.returncode == 2 and ".html or .svg" in result.stderr
    assert not (tmp_path / "x.png").exists()


def test_the_units_run_the_documented_venv_and_tolerate_a_missing_job_dir() -> None:
    root = Path(__file__).parents[1]
    for unit in ("dflashd.service", "dflashd@.service"):
        text = (root / "systemd" / unit).read_text()
        assert "ExecStart=/opt/dflashd/bin/dflashd start --foreground" in text
        assert "ReadWritePaths=/var/lib/dflashd -/srv/training" in text
        assert "Delegate=yes" in text
    readme = (root / "README.md").read_text()
    assert "python3 -m venv /opt/dflashd" in readme and (root / "LICENSE").is_file()


def test_since_accepts_utc_and_offsets() -> None:
    from dflashd.supervisor.client.common import parse_since

    assert parse_since("2026-11-30T18:00:00Z") == "2026-11-30T18:00:00.000000Z"
    assert parse_since("2026-11-30T20:00:00+02:00") == "2026-11-30T18:00:00.000000Z"
