"""Issue 54: everyday paths IV, as a user types them (the real CLI, real daemons and jobs).

``restart`` replays the start's environment (pm2's habit), never prints it, takes the caller's
with ``--env-from-shell``, and never stops a healthy run for a restart that cannot launch.
``ls`` lists every home the user started, however its home was given, newest first.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from dflashd.logs import LineRecord
from tests.conftest import Daemon, child, dflashd_argv, run_cli, write_config

SECRET = "hunter2-do-not-print"


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        dflashd_argv(*args), env=env, capture_output=True, text=True, timeout=120, check=False
    )


def _foreground(home: Path, config: Path, *command: str) -> subprocess.CompletedProcess[str]:
    """``dflashd start --foreground --quiet`` on ``home``, to the daemon's end."""
    argv = ("start", "--foreground", "--quiet", "--home", str(home), "-c", str(config), "--")
    return run_cli(*argv, *command)


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


def _wait_state(env: dict[str, str], home: Path, states: tuple[str, ...]) -> dict[str, object]:
    deadline = time.monotonic() + 60
    view: dict[str, object] = {}
    while time.monotonic() < deadline:
        out = _cli(env, "status", "--json", "--home", str(home)).stdout
        view = json.loads(out) if out.strip() else {}
        if view.get("state") in states:
            return view
        time.sleep(0.2)  # polled through the CLI, as a user would; no event to wait on
    raise AssertionError(view)


def test_ls_lists_every_home_started_however_given_newest_first(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    config = write_config(tmp_path / "c.toml", {"gpus": "none"})
    done, odd = tmp_path / "done-home", tmp_path / "odd\nhome"
    ran = _cli(env, "start", f"--home={done}", "-c", str(config), "--", "sh", "-c", "echo step 1")
    assert ran.returncode == 0, ran.stderr
    _wait_state(env, done, ("completed",))
    _cli(env, "start", f"--home={odd}", "-c", str(config), "--", "sh", "-c", "exit 0")
    _wait_state(env, odd, ("completed",))
    # a foreground daemon whose home comes from DFLASHD_HOME: no --home word anywhere
    live = tmp_path / "live-home"
    fg_env = {**env, "DFLASHD_HOME": str(live)}
    argv = dflashd_argv("start", "--foreground", "--quiet", "-c", str(config), "--", "sleep", "600")
    daemon = subprocess.Popen(
        argv, env=fg_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        _wait_state(env, live, ("running",))
        # its registry entry removed: /proc alone must find it
        assert _cli(env, "ls", "--forget", str(live)).stdout.endswith(": forgotten\n")
        shown = _cli(env, "ls")
        assert shown.returncode == 0, shown.stderr
        rows = [json.loads(line) for line in _cli(env, "ls", "--json").stdout.splitlines()]
        rows = [r for r in rows if r["home"].startswith(str(tmp_path))]  # not other tests' daemons
        homes = [r["home"] for r in rows]
        assert homes == [str(live), str(odd), str(done)], homes  # newest first
        assert [r["state"] for r in rows] == ["running", "completed*", "completed*"]
        lines = shown.stdout.splitlines()
        assert any("odd\\x0ahome" in line for line in lines), shown.stdout  # escaped, one row
        assert lines[-1].startswith("* not running:"), shown.stdout
        # one wording for goodput: ls says what status says (the share of the working time)
        said = _cli(env, "status", "--home", str(done)).stdout
        share = re.search(r"goodput\s+(\S+ % of \S+)", said)
        row = next(line for line in lines if line.startswith(str(done)))
        assert share is not None and share.group(1) in row, (said, row)
        running = _cli(env, "ls", "--running", "--json").stdout.splitlines()
        ours = [json.loads(line)["home"] for line in running]
        assert [h for h in ours if h.startswith(str(tmp_path))] == [str(live)]
        assert _cli(env, "ls", "--forget", str(done)).stdout.endswith(": forgotten\n")
        assert str(done) not in _cli(env, "ls").stdout
        shutil.rmtree(odd)  # deleted since: dropped from the list, no error
        after = _cli(env, "ls", "--json")
        assert after.returncode == 0, after
        # other tests' daemons are listed too (one runs tests/children/odd_losses.py)
        left = [json.loads(line)["home"] for line in after.stdout.splitlines()]
        assert str(odd) not in left and [h for h in left if h.startswith(str(tmp_path))], after
    finally:
        daemon.terminate()
        daemon.wait(60)


def test_a_relative_cwd_under_a_systemd_unit_is_refused_in_one_line(tmp_path: Path) -> None:
    """A unit runs in / (read-only under ProtectSystem=strict): ``cwd = "."`` there is refused,
    nothing launched; the same config from a shell runs where the shell is."""
    config = write_config(tmp_path / "c.toml", {"gpus": "none", "cwd": "."})
    home = tmp_path / "home"
    unit = {**os.environ, "INVOCATION_ID": "0123456789abcdef"}
    argv = dflashd_argv(
        "start", "--foreground", "--home", str(home), "-c", str(config), "--", "true"
    )
    refused = subprocess.run(argv, env=unit, cwd="/", capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2, refused
    assert (
        refused.stderr.count("\n") == 1
        and "relative" in refused.stderr
        and "systemd" in refused.stderr
    )
    assert not (home / "logs").exists()


BAR_JOB = r"""
import sys
for i in range(31):
    sys.stderr.write(f"\r{i * 100 // 30:3d}%|{'#' * (i // 3):10s}| {i}/30")
    sys.stderr.flush()
sys.stderr.write("\n")
print("step 1 done", flush=True)
"""


def test_tail_shows_a_progress_bar_as_a_terminal_would(tmp_path: Path, home: Path) -> None:
    """tqdm's redraws are one line in ``tail``, its last state, never red as an error;
    ``--all`` shows every redraw; dflashd's records read as key=value, no Python reprs."""
    config = write_config(tmp_path / "c.toml", {"gpus": "none"})
    done = _foreground(home, config, sys.executable, "-c", BAR_JOB)
    assert done.returncode == 0, done.stderr
    shown = run_cli("tail", "--home", str(home), "-n", "4", "--src", "stderr").stdout
    bars = [line for line in shown.splitlines() if "/30" in line]
    assert len(bars) == 1 and "100%|##########| 30/30" in bars[0], shown
    assert " bar " in bars[0] and " err " not in bars[0], bars
    every = run_cli("tail", "--home", str(home), "-n", "100", "--src", "stderr", "--all").stdout
    assert sum("/30" in line for line in every.splitlines()) == 31, every
    events = run_cli("tail", "--home", str(home), "-n", "20", "--src", "dflashd").stdout
    spawn = next(line for line in events.splitlines() if " spawn " in line)
    assert "env_keys=DFLASHD_HOME,DFLASHD_HOME_ID," in spawn and "['" not in spawn, spawn
    exit_line = next(line for line in events.splitlines() if " exit " in line)
    assert "cost={" in exit_line and "'" not in exit_line, exit_line


def test_a_start_whose_spawn_failed_is_no_job_before(tmp_path: Path, home: Path) -> None:
    """A typo'd first start (its command does not exist) and then the right one: no warning
    that the home ran another job."""
    config = write_config(tmp_path / "c.toml", {"gpus": "none"})
    typo = _foreground(home, config, "/nonexistent/pyhton3", "train.py")
    assert typo.returncode != 0
    right = _foreground(home, config, sys.executable, "-c", "print('step 1')")
    assert right.returncode == 0, right.stderr
    assert "another job" not in right.stderr, right.stderr


def test_a_stop_signal_to_the_whole_tree_is_a_stop_not_a_crash(
    start_daemon: Callable[..., Daemon],
) -> None:
    """A scheduler signals every process of a job at once (Slurm's scancel and time limit,
    Ctrl-C in a terminal): the job dies of SIGTERM a moment before dflashd hears its own. That
    is a stop, never a crash relaunched (tests/test_slurm.py does it through a real Slurm)."""
    daemon = start_daemon(child("prints_then_waits.py"))
    launched = daemon.wait_event("launched", timeout=30)
    daemon.wait_for(lambda r: isinstance(r, LineRecord) and r.run == 1, 30)
    job = int(launched.fields["pid"])
    os.kill(job, signal.SIGTERM)  # the job first
    stat = Path(f"/proc/{job}/stat")
    for _ in range(200):  # until it is dead (a zombie, or reaped): dflashd has its SIGCHLD
        try:
            if stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break
        except OSError:
            break
        time.sleep(0.005)  # a death no event of ours announces
    os.kill(daemon.proc.pid, signal.SIGTERM)  # then dflashd, as the scheduler goes on
    assert daemon.wait(30) == 0
    assert [e.fields["verdict"] for e in daemon.events("exit")] == ["stopped"]
    assert daemon.events("restart") == [] and daemon.events("spawn")[-1].run == 1


def test_tail_of_the_previous_run_with_one_run_says_there_is_none(
    tmp_path: Path, home: Path
) -> None:
    """Issue 54: `tail --run previous` on a home with one run says there is no previous run
    (never "no run 0"), in one line, with the usage exit code."""
    config = write_config(tmp_path / "c.toml", {"gpus": "none"})
    done = _foreground(home, config, sys.executable, "-c", "print('step 1')")
    assert done.returncode == 0, done.stderr
    tailed = run_cli("tail", "--home", str(home), "--run", "previous")
    assert tailed.returncode == 2, tailed.stdout + tailed.stderr
    said = tailed.stderr.strip().splitlines()
    assert len(said) == 1 and "no previous run" in said[0] and "run 1 is the only one" in said[0]


def test_the_units_have_no_placeholder_and_install_torch_first() -> None:
    """Issue 54: the units' header installs torch before dflashd (a plain install pulls a
    multi-GB CUDA build) and names no placeholder documentation."""
    units = Path(__file__).parent.parent / "systemd"
    for unit in ("dflashd.service", "dflashd@.service"):
        text = (units / unit).read_text()
        assert "example.invalid" not in text and "Documentation=https://example" not in text
        installs = [line for line in text.splitlines() if "pip install" in line]
        # the template unit installs nothing itself (the plain unit's header says how)
        assert installs if unit == "dflashd.service" else True, unit
        assert not installs or "torch" in installs[0], (unit, installs)
