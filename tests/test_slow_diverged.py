"""Beyond alive, with real processes (issue 43): a job that runs slow against its own pace,
a bundled trainer whose loss goes NaN (a steady job with pauses raising neither is a history:
tests/test_reading.py)."""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dflashd.supervisor.host.pyspy import find_py_spy
from tests.conftest import Daemon, child, run_cli

CHILDREN = Path(__file__).parent / "children"

Start = Callable[..., Daemon]
pytestmark = pytest.mark.incidents  # these runs are made slow, or their loss diverge


def test_a_cpu_hog_on_the_jobs_cpu_is_named_and_the_run_recovers(
    start_daemon: Start, home: Path, tmp_path: Path
) -> None:
    """(a) A job stepping on one CPU learns its own pace; three hogs put on that CPU make each
    step wait: one ``slow`` incident naming the CPU wait, one alert; the hogs gone, the cadence
    comes back and the incident closes.  Never a kill, never a restart.  The job starts the
    hogs itself when told (``cpu_steps.py``): in its own cgroup, they slow it on a loaded
    machine as on a quiet one."""
    cpu = max(os.sched_getaffinity(0))
    hog_file = tmp_path / "hogs-on"
    daemon = start_daemon(child("cpu_steps.py", str(cpu), str(hog_file)))
    baseline = daemon.wait_event("pace", timeout=60)
    assert 0.004 < baseline.fields["baseline_step_s"] < 1.0
    started = time.monotonic()
    hog_file.touch()
    slow = daemon.wait_event("slow", timeout=120)
    detected_s = time.monotonic() - started
    hog_file.unlink()
    over = daemon.wait_event("slow_over", timeout=120)
    assert slow.fields["ratio"] >= 1.2
    assert any(c.startswith("waiting for CPU") for c in slow.fields["causes"]), slow.fields
    assert over.fields["lost_s"] > 0 and over.fields["worst_ratio"] >= 1.2
    assert len(daemon.events("slow")) == 1
    assert daemon.events("ending_run") == [] and daemon.events("exit") == []
    status = json.loads(run_cli("status", "--home", str(home), "--json").stdout)
    assert status["slow"] is None and status["pace"]["baseline_step_s"] > 0
    assert status["goodput"]["lost_s"]["slow"] > 0  # the ledger's slow bucket
    print(f"slow detected {detected_s:.1f} s after the hogs started")  # the note's figure


@pytest.mark.skipif(find_py_spy() is None, reason="py-spy is not installed")
def test_a_slowed_rank_under_torchrun_is_named_the_straggler(
    start_daemon: Start, home: Path
) -> None:
    """(b) Two gloo ranks under torchrun; rank 1 starts working 0.5 s more per step in its own
    code, rank 0 waits for it in ``all_reduce``: the slow incident names rank 1."""
    pytest.importorskip("torch")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    daemon = start_daemon(
        [*command, str(CHILDREN / "straggler.py"), "400"], first_step_timeout_s=300
    )
    daemon.wait_event("pace", timeout=180)
    slow = daemon.wait_event("slow", timeout=180)
    cause = daemon.wait_event("slow_cause", timeout=60)
    assert slow.fields["ratio"] >= 1.2
    assert cause.fields["straggler_ranks"] == [1], cause.fields
    assert "straggle" in str(cause.fields["where"])
    status = json.loads(run_cli("status", "--home", str(home), "--json").stdout)
    assert status["slow"]["straggler"]["straggler_ranks"] == [1]


@pytest.fixture
def alert_sink(tmp_path: Path) -> tuple[list[str], Path]:
    alerts_file = tmp_path / "alerts.jsonl"
    sink = tmp_path / "alert_sink.sh"
    sink.write_text(f"#!/bin/sh\ncat >> {alerts_file}\necho >> {alerts_file}\n")
    sink.chmod(sink.stat().st_mode | stat.S_IXUSR)
    return [str(sink)], alerts_file


def _alerts(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _trainer(home: Path, nan_at: int) -> list[str]:
    command = [sys.executable, "-m", "dflashd.trainer", "--device", "cpu", "--steps", "60"]
    command += ["--log-every", "1", "--checkpoint-dir", str(home.parent / "ck")]
    return [*command, "--inject", f"nan_at_step:{nan_at}"]


@pytest.mark.parametrize("on_diverge", ["alert", "stop"])
def test_the_bundled_trainers_nan_is_diverged_within_one_logged_step(
    start_daemon: Start, home: Path, alert_sink: tuple[list[str], Path], on_diverge: str
) -> None:
    """(d) ``--inject nan_at_step:12``: ``diverged`` at step 12 (it logs every step).  With
    ``alert`` one alert and the run goes on to complete; with ``stop`` the run is ended, never
    relaunched, and the end's one alert says the last good step."""
    pytest.importorskip("torch")
    sink, alerts_file = alert_sink
    daemon = start_daemon(
        _trainer(home, 12),
        on_diverge=on_diverge,
        alerts={"command": sink},
        first_step_timeout_s=300,
    )
    diverged = daemon.wait_event("diverged", timeout=240)
    assert diverged.fields["step"] == 12
    good = diverged.fields["last_good_step"]
    assert isinstance(good, int) and 0 < good < 12  # the last loss judged good (lines posted
    # together are judged by their newest: an earlier step, never a later one)
    code = daemon.wait(240)
    exits = daemon.events("exit")
    sent = _alerts(alerts_file)
    if on_diverge == "alert":
        assert code == 0 and [e.fields["verdict"] for e in exits] == ["completed"]
        assert [a["verdict"] for a in sent] == ["diverged"]
        # the lines around the divergence, as the job printed them (issue 54)
        assert any("nan" in str(line).lower() for line in sent[0]["tail"]), sent[0]["tail"]
    else:
        assert code == 4 and [e.fields["verdict"] for e in exits] == ["diverged"]
        assert daemon.events("restart") == []
        assert [a["verdict"] for a in sent] == ["fatal"]
        assert f"loss_diverged_at_step_12_last_good_{good}" in str(sent[0]["reason"])


def test_a_relaunch_that_diverges_at_the_same_step_again_stops(
    start_daemon: Start, home: Path
) -> None:
    """Never a restart loop: ``alert`` mode, the run crashes after its divergence and is
    relaunched; the relaunch diverges at the same step again, and is stopped there."""
    daemon = start_daemon(child("diverges_then_crashes.py"), restart={"runtime_retries": 5})
    assert daemon.wait(120) == 4
    diverged = daemon.events("diverged")
    assert [d.fields["then"] for d in diverged] == ["alert", "stop"]
    assert [e.fields["verdict"] for e in daemon.events("exit")] == ["crashed", "diverged"]


def test_the_stop_of_a_diverged_run_is_not_signalled_twice(start_daemon: Start) -> None:
    """A job printing NaN and staying alive under ``stop``: ended once (a dump, then SIGKILL)."""
    daemon = start_daemon(child("diverges_then_crashes.py", "stay"), on_diverge="stop")
    assert daemon.wait(120) == 4
    assert len(daemon.events("ending_run")) == 1
    exit_record = daemon.events("exit")[0]
    assert exit_record.fields["verdict"] == "diverged"
    assert exit_record.fields["signal"] in (signal.SIGKILL.name, "SIGKILL")
