"""The warm standby (issue 51), with real children: the next run's interpreter started while
a run trains, its imports done; the relaunch runs in it as ``python script.py`` would (argv,
``__main__``, ``sys.path[0]``, ``__file__``, exit codes, tracebacks, signals), and falls back to
a cold launch, said in the spawn record, whenever anything differs."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dflashd.logs import EventRecord, LineRecord
from dflashd.supervisor.host.standby import python_job
from tests.conftest import Daemon, child, run_cli

Start = Callable[..., Daemon]
pytestmark = pytest.mark.trainer  # the standby imports torch where it is installed


def _as(daemon: Daemon, run: int) -> dict[str, object]:
    for rec in daemon.records():
        if isinstance(rec, LineRecord) and rec.run == run and rec.line.startswith("as "):
            return dict(json.loads(rec.line[3:]))
    raise AssertionError(f"run {run} never said what it runs as")


def _spawn(daemon: Daemon, run: int) -> dict[str, object]:
    found = [e for e in daemon.events("spawn") if e.run == run]
    assert found, daemon.records()[-20:]
    return dict(found[0].fields)


@pytest.fixture
def helper(tmp_path: Path) -> Path:
    """A module outside the job's directory, on PYTHONPATH: the standby imports it ahead."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "helper_mod.py").write_text("VALUE = 1\n")
    return site


def _env(helper: Path, **extra: str) -> dict[str, str]:
    return {"PYTHONPATH": str(helper), **extra}


def _warm(start: Start, helper: Path, job: list[str], retries: int = 2, **env: str) -> Daemon:
    """A daemon with warm_standby on and the job's helper module on PYTHONPATH."""
    restart = {"runtime_retries": retries}
    return start(job, restart=restart, warm_standby=True, env=_env(helper, **env))


def test_a_relaunch_runs_warm_exactly_as_a_cold_launch(start_daemon: Start, helper: Path) -> None:
    daemon = _warm(start_daemon, helper, child("warm_job.py", "exit5", "two words"))
    assert daemon.wait(180) == 4 or daemon.proc.returncode is not None
    exits = {e.run: e.fields for e in daemon.events("exit")}
    assert exits[1]["exit_code"] == 3 and exits[2]["exit_code"] == 5, exits
    assert daemon.events("standby") and _spawn(daemon, 1)["start"] == "cold"
    assert _spawn(daemon, 2)["start"] == "warm", _spawn(daemon, 2)
    cold, warm = _as(daemon, 1), _as(daemon, 2)
    for key in ("argv", "name", "path0", "file"):
        assert warm[key] == cold[key], (key, warm, cold)
    assert warm["name"] == "__main__" and warm["argv"][1:] == ["exit5", "two words"]  # type: ignore[index]
    has_torch = importlib.util.find_spec("torch") is not None
    assert warm["torch"] is has_torch and cold["torch"] is False  # imported before its first line


def test_a_module_the_standby_imported_changed_on_disk_means_a_cold_launch_said_once(
    start_daemon: Start, helper: Path
) -> None:
    daemon = _warm(
        start_daemon, helper, child("warm_job.py", "exit5"), TOUCH=str(helper / "helper_mod.py")
    )
    daemon.wait(180)
    spawn = _spawn(daemon, 2)
    assert spawn["start"] == "cold" and "helper_mod.py changed on disk" in str(
        spawn["cold_because"]
    )
    assert _as(daemon, 2)["torch"] is False  # a cold interpreter


def test_an_uncaught_exception_in_a_warm_run_reads_as_a_cold_ones(
    start_daemon: Start, helper: Path
) -> None:
    daemon = _warm(start_daemon, helper, child("warm_job.py", "raise"), retries=1)
    daemon.wait(180)
    assert _spawn(daemon, 2)["start"] == "warm"
    warm_exit = next(e for e in daemon.events("exit") if e.run == 2).fields
    assert warm_exit["exit_code"] == 1
    tail = "\n".join(str(x) for x in warm_exit.get("tail") or [])
    assert "ValueError: boom at step 5" in tail and "warm_job.py" in tail
    assert "standby.py" not in tail and "runpy" not in tail  # the job's own frames only


def test_a_warm_run_is_stopped_by_its_signals_as_a_cold_one(
    start_daemon: Start, helper: Path, home: Path
) -> None:
    # run 1 takes 200 steps (10 s): run 2, read as it redoes them, is not back past them
    # however slowly status answers on a loaded machine (20 steps: it was, 55 in, once)
    daemon = _warm(start_daemon, helper, child("warm_job.py", "wait"), RUN1_STEPS="200")
    daemon.wait_for(
        lambda r: isinstance(r, LineRecord) and r.run == 2 and r.line.startswith("step 3 "), 180
    )
    assert _spawn(daemon, 2)["start"] == "warm"
    # the log has the line before the daemon's progress has the step (steps are posted four
    # times a second): status is read again until it counts the steps redone, within a bound
    deadline = time.monotonic() + 10
    while True:
        status = json.loads(run_cli("status", "--json", "--home", str(home)).stdout)
        redone = (status.get("recovery") or {}).get("redone_steps") or 0
        if redone >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.1)  # a short step of a bounded poll: no event says a post landed
    assert status["standby"] is None or status["standby"]["for_run"] == 3
    recovery = status["recovery"]  # the relaunch, split (issue 51 part 4)
    assert recovery["run"] == 2 and recovery["after"] == "crashed", recovery
    assert recovery["start"] == "warm" and recovery["start_s"] is not None, recovery
    assert recovery["redone_steps"] >= 3 and not recovery["back"], recovery  # run 1 got past 20
    assert recovery["teardown_s"] >= 0 and recovery["detection_s"] >= 0, recovery
    shown = run_cli("status", "--home", str(home)).stdout
    assert "recovery of run 2 (after crashed):" in shown and "warm start" in shown, shown
    run_cli("stop", "--home", str(home), "--timeout", "10")
    assert daemon.wait(60) == 0
    ended = next(e for e in daemon.events("exit") if e.run == 2).fields
    assert ended["verdict"] == "stopped" and ended["signal"] in ("SIGTERM", 15), ended


def test_status_shows_the_standby_and_its_memory(
    start_daemon: Start, helper: Path, home: Path
) -> None:
    daemon = _warm(start_daemon, helper, child("warm_job.py", "wait"), HOLD="1")
    daemon.wait_event("standby", timeout=60)
    status = json.loads(run_cli("status", "--json", "--home", str(home)).stdout)
    standby = status["standby"]
    assert standby is not None and standby["for_run"] == 2 and standby["pid"] > 0
    assert standby["rss_mib"] is None or standby["rss_mib"] > 1
    shown = run_cli("status", "--home", str(home)).stdout
    assert "standby" in shown


@pytest.mark.parametrize(
    ("argv", "eligible"),
    [
        (("python", "train.py", "--lr", "3"), ("script", "train.py")),
        (("/usr/bin/python3.11", "-u", "-X", "dev", "train.py"), ("script", "train.py")),
        (("python3", "-m", "pkg.train", "x"), ("module", "pkg.train")),
        (("torchrun", "--nproc-per-node", "2", "train.py"), None),  # torchrun's own children
        (("python", "-c", "print(1)"), None),
        (("bash", "run.sh"), None),
        (("python",), None),
        (("python", "--weird", "train.py"), None),  # an option not known: never guessed
    ],
)
def test_which_commands_can_have_a_standby(
    argv: tuple[str, ...], eligible: tuple[str, str] | None
) -> None:
    job = python_job(argv)
    assert (None if job is None else (job.mode, job.target)) == eligible


def test_a_command_that_is_not_python_never_gets_a_standby(start_daemon: Start) -> None:
    daemon = start_daemon(
        ["sh", "-c", "for i in 1 2 3 4 5; do echo step $i; sleep 0.05; done"], warm_standby=True
    )
    assert daemon.wait(60) == 0
    assert daemon.events("standby") == [] and _spawn(daemon, 1)["start"] == "cold"
    assert isinstance(daemon.events("exit")[0], EventRecord)


def test_a_script_that_sets_import_time_environment_runs_cold_said_once(
    start_daemon: Start, helper: Path, tmp_path: Path
) -> None:
    """``os.environ["OMP_NUM_THREADS"] = "1"`` before ``import torch``: a standby that imported
    torch first would miss it, so the relaunch is cold and its spawn record says why."""
    job = tmp_path / "envjob.py"
    source = (Path(__file__).parent / "children" / "warm_job.py").read_text()
    job.write_text('import os\nos.environ["OMP_NUM_THREADS"] = "1"\n' + source)
    daemon = _warm(start_daemon, helper, [sys.executable, str(job), "exit5"])
    daemon.wait(180)
    spawn = _spawn(daemon, 2)
    assert spawn["start"] == "cold" and "environment variables" in str(spawn["cold_because"])
