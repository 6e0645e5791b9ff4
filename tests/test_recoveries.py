"""One recovery, split (issue 51 part 4): detection, teardown, a warm or cold start and the
redone steps, as status, its text, Prometheus and the report show them.  Pure: values in,
values out (the standby's real-process test checks the same split through the CLI)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dflashd.supervisor.client.reportdata import collect
from dflashd.supervisor.client.runtable import run_table
from dflashd.supervisor.model.progress import Progress
from dflashd.supervisor.model.recoveries import recovery_split
from dflashd.supervisor.model.runstate import RunState
from dflashd.supervisor.speak.fieldtext import recovery_line
from dflashd.supervisor.speak.metrics import metric_families
from tests.tables import WALL_AT_ZERO, event_at

DIED_AT = 100.0  # monotonic: run 1's death
HUNG_EXIT = {
    "run": 1,
    "ended_at": WALL_AT_ZERO + DIED_AT,
    "verdict": "stalled",
    "reason": "hung",
    "cost": {"productive_s": 80.0, "detection_s": 6.0},
}


def _relaunch(at: float, start: str = "warm", best_before: int | None = 150) -> RunState:
    progress = Progress(at, True, best_before=best_before)
    run = RunState(2, ("python", "train.py"), at, WALL_AT_ZERO + at, progress)
    return replace(run, start=start)


def _stepped(run: RunState, steps: list[tuple[float, int]]) -> RunState:
    progress = run.progress
    for now, step in steps:
        progress, _ = progress.on_step(now, step=step, first=False, source="pattern")
    return replace(run, progress=progress)


def test_a_relaunch_is_split_into_detection_teardown_start_and_redone() -> None:
    run = _relaunch(100.4)  # torn down in 0.4 s
    waiting = recovery_split(HUNG_EXIT, run, now=100.7)
    assert waiting is not None and waiting.start_s is None and not waiting.back
    assert waiting.detection_s == 6.0 and waiting.teardown_s == pytest.approx(0.4)
    # resumed from the checkpoint at step 101: steps 101..150 are redone, one every 0.1 s
    run = _stepped(run, [(101.0 + 0.1 * i, 101 + i) for i in range(45)])
    redoing = recovery_split(HUNG_EXIT, run, now=105.5)
    assert redoing is not None and redoing.start_s == pytest.approx(0.6)
    assert redoing.redone_steps == 45 and redoing.redone_s == pytest.approx(4.5)
    assert not redoing.back
    run = _stepped(run, [(101.0 + 0.1 * i, 101 + i) for i in range(45, 60)])
    back = recovery_split(HUNG_EXIT, run, now=200.0)
    assert back is not None and back.back and back.redone_steps == 50
    assert back.redone_s == pytest.approx(
        4.9
    )  # step 150 reached: the pass, not now: a finished recovery stays
    assert back.total_s == pytest.approx(6.0 + 0.4 + 0.6 + 4.9)
    view = back.view()
    assert view["start"] == "warm" and view["total_s"] == pytest.approx(11.9)
    line = recovery_line(view)
    assert line.startswith("recovery of run 2 (after stalled): detection 6.0s, teardown 0.4s")
    assert "warm start 0.6s" in line and "redone 50 steps 4.9s = 11.9s" in line
    assert "so far" not in line and "so far" in recovery_line(redoing.view())


@pytest.mark.parametrize(
    "last_exit",
    [
        None,
        {},
        {**HUNG_EXIT, "verdict": "stopped"},  # a user's start after a stop
        {**HUNG_EXIT, "verdict": "completed"},
        {**HUNG_EXIT, "run": 2},  # the live run's own exit: not one before it
        {**HUNG_EXIT, "run": "1"},
    ],
)
def test_a_first_run_or_a_users_start_is_no_recovery(last_exit: dict[str, object] | None) -> None:
    assert recovery_split(last_exit, _relaunch(101.0), now=102.0) is None


def test_odd_stored_exits_never_raise_and_read_as_zero() -> None:
    odd = {**HUNG_EXIT, "cost": {"detection_s": float("nan")}, "ended_at": "yesterday"}
    split = recovery_split(odd, _relaunch(101.0, start="cold", best_before=None), now=102.0)
    assert split is not None and split.detection_s == 0.0 and split.teardown_s == 0.0
    assert split.redone_steps is None and split.start == "cold"
    assert recovery_split({**HUNG_EXIT, "cost": [1]}, _relaunch(101.0), 102.0) is not None


def test_prometheus_shows_each_part_labelled_warm_or_cold() -> None:
    run = _stepped(_relaunch(100.4), [(101.0 + 0.1 * i, 101 + i) for i in range(10)])
    split = recovery_split(HUNG_EXIT, run, now=102.0)
    assert split is not None
    extra = {"log_written_bytes": 0.0, "log_dropped_bytes": 0.0}
    families = {f.name: f for f in metric_families({"recovery": split.view()}, extra, 0.0)}
    parts = {
        s.labels["part"]: (s.labels["start"], s.value)
        for s in families["dflashd_recovery_seconds"].samples
    }
    assert parts["detection"] == ("warm", 6.0) and parts["start"][1] == pytest.approx(0.6)
    assert set(parts) == {"detection", "teardown", "start", "redone"}
    assert families["dflashd_recovery_redone_steps"].samples[0].value == 10
    quiet = {f.name for f in metric_families({"recovery": None}, extra, 0.0)}
    assert "dflashd_recovery_seconds" not in quiet


def test_the_reports_table_says_warm_or_cold_and_the_steps_redone() -> None:
    records = [
        event_at(1, "spawn", 0.0, argv=["python", "t.py"], start="cold"),
        event_at(1, "first_step", 5.0, step=1),
        event_at(1, "progress", 30.0, step=150),
        event_at(
            1,
            "exit",
            31.0,
            verdict="crashed",
            reason="exit 1",
            step=150,
            cost={"productive_s": 26.0, "startup_s": 5.0},
        ),
        event_at(2, "spawn", 32.0, argv=["python", "t.py"], start="warm", downtime_s=1.0),
        event_at(2, "first_step", 32.5, step=101),
        event_at(2, "progress", 40.0, step=160),
        event_at(
            2,
            "exit",
            41.0,
            verdict="completed",
            reason="exit 0",
            step=160,
            cost={"redone_s": 5.0, "startup_s": 0.5, "productive_s": 3.5},
        ),
    ]
    data = collect(records)
    assert data.redone_steps(1) is None and data.redone_steps(2) == 50
    table = run_table(data)
    assert "5.0s cold" in table and "0.50s warm" in table, table
    assert "(50 steps)" in table, table
