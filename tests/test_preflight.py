"""Never relaunch onto a GPU that cannot work (issue 51): the pre-flight as tables (scripted
NVML reads), through the reducer, and with a real daemon and a scripted sampler."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from dflashd.supervisor.model.effects import Launch, SendAlert, WriteRecord
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.exitcodes import EXIT_GPU_UNUSABLE
from dflashd.supervisor.model.inputs import ReleaseLooked, Started
from dflashd.supervisor.model.lifecycle import State
from dflashd.supervisor.model.preflight import (
    OPERATOR_REBOOT,
    UNUSABLE_XIDS,
    GpuHealth,
    preflight,
)
from dflashd.supervisor.model.step import DaemonState, Rules, step
from dflashd.supervisor.model.verdicts import Notice
from tests.conftest import run_cli, write_config

OK = GpuHealth(0, "GPU-0", recovery_action=0, retired_pending=False, remap_failed=False)


@pytest.mark.parametrize(
    ("health", "ecc", "xids", "unusable"),
    [
        (OK, {}, (), None),
        (GpuHealth(0, "GPU-0"), {}, (), None),  # an older driver: nothing to read, nothing held
        (GpuHealth(0, answers=False, error="GPU is lost"), {}, (), "does not answer"),
        (GpuHealth(0, recovery_action=1), {}, (), "a GPU reset"),
        (GpuHealth(0, recovery_action=2), {}, (), "a node reboot"),
        (GpuHealth(0, recovery_action=4), {}, (), "a drain, then a reset"),
        (GpuHealth(0, retired_pending=True), {}, (), "page retirement is pending"),
        (GpuHealth(0, remap_failed=True), {}, (), "row remapper failed"),
        (GpuHealth(0, uncorrectable_ecc=3), {0: 1}, (), "rose from 1 to 3"),
        (GpuHealth(0, uncorrectable_ecc=3), {0: 3}, (), None),  # as at launch: not this run's
        (OK, {}, (13,), None),  # a graphics engine exception: the job's, not the GPU's
        (OK, {}, (31,), None),  # a memory page fault: the job's
    ],
    ids=[
        "healthy",
        "old driver",
        "lost",
        "reset",
        "reboot",
        "drain",
        "pages",
        "remap",
        "ecc rose",
        "ecc as before",
        "xid 13",
        "xid 31",
    ],
)
def test_what_makes_a_gpu_unusable(
    health: GpuHealth, ecc: dict[int, int], xids: tuple[int, ...], unusable: str | None
) -> None:
    checked = preflight((health,), ecc, {0: xids}, allowed=None, fallback=False)
    if unusable is None:
        assert checked.ok and not checked.stop
    else:
        assert checked.stop and unusable in " ".join(checked.unusable[0].evidence)


@pytest.mark.parametrize("xid", sorted(UNUSABLE_XIDS))
def test_each_documented_xid_marks_its_gpu(xid: int) -> None:
    checked = preflight((OK,), {}, {-1: (xid,)}, allowed=None, fallback=False)
    assert checked.stop and f"XID {xid}" in checked.unusable[0].evidence[0]
    assert (checked.unusable[0].operator == OPERATOR_REBOOT) is (xid == 79)


def test_a_driver_without_the_recovery_field_is_said_never_held_against_the_gpu() -> None:
    checked = preflight((GpuHealth(0, "GPU-0"),), {}, {}, allowed=None, fallback=False)
    assert checked.ok and "570" in checked.notes[0]


def test_with_fallback_the_job_is_relaunched_on_the_other_gpus() -> None:
    bad = GpuHealth(1, "GPU-1", retired_pending=True)
    others = (OK, bad, GpuHealth(2), GpuHealth(3))
    checked = preflight(others, {}, {}, allowed=(0, 1, 2, 3), fallback=True)
    assert checked.visible == (0, 2, 3) and not checked.stop
    alone = preflight((bad,), {}, {}, allowed=(1,), fallback=True)
    assert alone.stop  # no other GPU to go to


def _dead_run_state(rules: Rules) -> DaemonState:
    state, _ = step(DaemonState(rules=rules), Started(), 0.0)
    return state


def test_through_the_reducer_an_unusable_gpu_stops_with_one_alert_and_exit_75() -> None:
    state = _dead_run_state(Rules())
    bad = GpuHealth(0, "GPU-abc", recovery_action=1)
    after, effects = step(state, ReleaseLooked(None, None, (bad,), {}), 5.0)
    alerts = [e for e in effects if isinstance(e, SendAlert)]
    assert [a.kind for a in alerts] == [Notice.GPU_UNUSABLE]
    assert "GPU-abc" in alerts[0].reason and "nvidia-smi -r -i 0" in alerts[0].reason
    assert not any(isinstance(e, Launch) for e in effects)
    assert after.loop.exit_code == EXIT_GPU_UNUSABLE and after.loop.state is State.FATAL
    events = [e.event for e in effects if isinstance(e, WriteRecord)]
    assert events == [Event.GPU_PREFLIGHT, Event.GPU_UNUSABLE]


def test_through_the_reducer_a_healthy_gpu_is_relaunched_onto_with_a_record() -> None:
    state = _dead_run_state(Rules())
    _state, effects = step(state, ReleaseLooked(None, None, (OK,), {}), 5.0)
    assert any(isinstance(e, Launch) and e.visible_gpus is None for e in effects)
    records = [e for e in effects if isinstance(e, WriteRecord)]
    assert records[0].event == Event.GPU_PREFLIGHT and records[0].fields["ok"] is True


def test_through_the_reducer_fallback_relaunches_on_the_rest() -> None:
    state = _dead_run_state(Rules(gpus_allowed=(0, 1), gpu_fallback=True))
    bad = GpuHealth(1, "GPU-1", answers=False, error="lost")
    _state, effects = step(state, ReleaseLooked(None, None, (OK, bad), {}), 5.0)
    launch = next(e for e in effects if isinstance(e, Launch))
    assert launch.visible_gpus == (0,)
    assert [e.kind for e in effects if isinstance(e, SendAlert)] == [Notice.GPU_UNUSABLE]


def test_a_real_daemon_never_relaunches_onto_a_gpu_that_needs_a_reset(tmp_path: Path) -> None:
    """A job that crashes; the scripted NVML says its GPU asks for a reset: one ``gpu_unusable``
    alert naming the GPU and its UUID, no second run, the daemon exits 75."""
    script = tmp_path / "gpu.json"
    holding = [
        {
            "index": 0,
            "memory_used_mib": 900,
            "memory_total_mib": 80000,
            "utilization_pct": 50,
            "processes": [["child", 900]],
        }
    ]
    free = [{"index": 0, "memory_used_mib": 0, "memory_total_mib": 80000, "utilization_pct": 0}]
    script.write_text(json.dumps([holding, holding, free]))
    health = [{"index": 0, "uuid": "GPU-7e57", "recovery_action": 1}]
    script.with_suffix(".health.json").write_text(json.dumps(health))
    alerts = tmp_path / "alerts.jsonl"
    config = write_config(
        tmp_path / "c.toml",
        {"gpus": "all", "gpu_poll_s": 0.1},
        restart={"backoff_initial_s": 0.0, "early_retries": 5, "runtime_retries": 5},
        alerts={"file": str(alerts)},
    )
    home = tmp_path / "home"
    runner = Path(__file__).parent / "scripted_daemon.py"
    job = [
        sys.executable,
        "-c",
        "import time; print('step 1', flush=True); time.sleep(1); raise SystemExit(3)",
    ]
    import subprocess

    done = subprocess.run(
        [sys.executable, str(runner), str(script), str(home), str(config), "--", *job],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == EXIT_GPU_UNUSABLE, (done.returncode, done.stderr[-2000:])
    sent = [json.loads(line) for line in alerts.read_text().splitlines() if line.strip()]
    unusable = [
        a for a in sent if a.get("verdict") == "gpu_unusable" or a.get("kind") == "gpu_unusable"
    ]
    assert len(unusable) == 1 and "GPU-7e57" in json.dumps(unusable[0]), sent
    shown = run_cli("tail", "-n", "50", "--home", str(home)).stdout
    assert "gpu_unusable" in shown and "spawn" in shown
    assert shown.count(" spawn ") == 1  # never relaunched
