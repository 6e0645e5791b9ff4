"""Goodput (issue 33), the pure side: every second in one bucket, totals that only grow.

The real-process scenarios (a SIGKILL after a checkpoint, no checkpoint, a daemon killed and
started again) are in tests/test_goodput_runs.py.
"""

from __future__ import annotations

import math

import pytest

from dflashd.supervisor.model.goodput import (
    Cost,
    GoodputLedger,
    Recovery,
    RunTimes,
    cost_from_json,
    cost_to_json,
    goodput_line,
    goodput_view,
    restored_ledger,
    run_cost,
    view_from_json,
)
from dflashd.supervisor.model.policy import RestartConfig, RestartHistory, decide
from dflashd.supervisor.model.progress import Progress
from dflashd.supervisor.model.verdicts import Verdict

# launch at 0, first step at 10, steps to 100: the same run under each ending
RUN = RunTimes(launched=0.0, first_step=10.0, last_progress=100.0, stepped=True)


@pytest.mark.parametrize(
    ("times", "until", "ended", "completed", "stop_at", "expected"),
    [
        # a crash 0.5 s after its last step: the half second is detection
        (RUN, 100.5, True, False, None, Cost(productive_s=90, startup_s=10, detection_s=0.5)),
        # a completed run's last save is productive
        (RUN, 103.0, True, True, None, Cost(productive_s=93, startup_s=10)),
        # live: the time since the last step is not settled yet
        (RUN, 104.0, False, False, None, Cost(productive_s=90, startup_s=10)),
        # a run that never stepped: all startup, live or dead
        (RunTimes(launched=5.0), 65.0, True, False, None, Cost(startup_s=60)),
        (RunTimes(launched=5.0), 65.0, False, False, None, Cost(startup_s=60)),
        # resumed below the earlier best: first step -> the pass is redone
        (
            RunTimes(0.0, 10.0, 100.0, best_before=500, passed_best=40.0, stepped=True),
            100.0,
            True,
            False,
            None,
            Cost(productive_s=60, startup_s=10, redone_s=30),
        ),
        # never passed the earlier best: everything after the first step is redone
        (
            RunTimes(0.0, 10.0, 100.0, best_before=500, stepped=True),
            101.0,
            True,
            False,
            None,
            Cost(startup_s=10, redone_s=90, detection_s=1),
        ),
        # no step numbers at all: nothing can be redone
        (
            RunTimes(0.0, 10.0, 100.0, best_before=500, stepped=False),
            100.0,
            True,
            False,
            None,
            Cost(productive_s=90, startup_s=10),
        ),
        # a user's stop at 50, the run ends at 52: healthy until the stop, stopped after
        (RUN, 52.0, True, False, 50.0, Cost(productive_s=40, startup_s=10, stopped_s=2)),
        # a stop during start-up
        (RunTimes(launched=0.0), 30.0, True, False, 20.0, Cost(startup_s=20, stopped_s=10)),
    ],
)
def test_run_cost_puts_every_second_in_one_bucket(
    times: RunTimes,
    until: float,
    ended: bool,
    completed: bool,
    stop_at: float | None,
    expected: Cost,
) -> None:
    cost = run_cost(times, until, ended=ended, completed=completed, stop_at=stop_at)
    assert cost == expected
    if ended:
        assert cost.total_s == pytest.approx(until - times.launched)


def test_the_ledger_over_a_crash_a_backoff_and_a_resumed_run() -> None:
    book = GoodputLedger(first_start=1000.0, gap_since=0.0)
    assert book.downtime_s(0.5) == 0.5  # the daemon's own start: downtime
    book = book.launched(0.5)
    first = RunTimes(0.5, 10.0, 60.0, stepped=True)
    book = book.ended(run_cost(first, 60.2, ended=True), 60.2, relaunch=True)
    assert book.downtime_s(63.2) == pytest.approx(3.0)
    book = book.launched(63.2)
    assert book.closed.downtime_s == pytest.approx(3.5)
    second = RunTimes(63.2, 70.0, 90.0, best_before=500, passed_best=80.0, stepped=True)
    view = book.view(second, 95.0)  # 5 s since its last step: not settled
    assert view["lost_s"] == {
        "startup": pytest.approx(9.5 + 6.8),
        "detection": pytest.approx(0.2),
        "downtime": pytest.approx(3.5),
        "redone": pytest.approx(10.0),
        "slow": 0.0,
    }
    assert view["productive_s"] == pytest.approx(50.0 + 10.0)
    assert view["wall_s"] == pytest.approx(90.0)  # settled up to the last step
    assert view["ratio"] == pytest.approx(60.0 / 90.0, abs=1e-6)
    book = book.stopping(91.0)
    stopped = book.view(second, 93.0)
    assert stopped["stopped_s"] == pytest.approx(2.0)
    assert stopped["productive_s"] == pytest.approx(61.0)  # healthy up to the stop


def test_totals_only_grow_while_a_run_steps_and_dies() -> None:
    """Prometheus counters: no bucket ever goes back, through a pass and a death."""
    progress = Progress(started_mono=0.0, best_before=30)
    book = GoodputLedger(first_start=1.0, gap_since=0.0).launched(0.0)
    before = goodput_view(Cost())
    for i in range(1, 60):
        progress, _ = progress.on_step(float(i), step=20 + i, first=False, source="pattern")
        times = RunTimes(
            0.0,
            progress.first_step_mono,
            progress.last_progress_mono,
            30,
            progress.passed_best_mono,
            True,
        )
        for now in (i + 0.3, i + 0.9):
            view = book.view(times, now)
            assert view["productive_s"] >= before["productive_s"]
            for cause, seconds in view["lost_s"].items():
                assert seconds >= before["lost_s"][cause]  # type: ignore[literal-required]
            before = view
    assert progress.passed_best_mono == pytest.approx(10.0)  # step 31 came at 11: 30 at 10


def test_a_pass_between_two_posted_steps_is_placed_in_proportion() -> None:
    progress = Progress(started_mono=0.0, best_before=50)
    progress, _ = progress.on_step(1.0, step=41, first=True, source="pattern")
    progress, _ = progress.on_step(2.0, step=46, first=False, source="pattern")
    progress, _ = progress.on_step(3.0, step=56, first=False, source="pattern")
    assert progress.passed_best_mono == pytest.approx(2.4)  # 50 is 4/10 of the way 46 -> 56


def test_saved_totals_read_back_whatever_the_file_holds() -> None:
    cost = Cost(productive_s=5, startup_s=1, redone_s=2)
    assert cost_from_json(cost_to_json(cost)) == cost
    hostile = {"productive_s": 10**5000, "startup_s": math.nan, "redone_s": -4, "stopped_s": True}
    assert cost_from_json(hostile) == Cost()
    assert cost_from_json([1, 2]) == Cost()
    assert view_from_json({"lost_s": "x"}) is None
    assert view_from_json(None) is None


def test_a_new_daemon_goes_on_from_the_saved_totals() -> None:
    saved = Cost(productive_s=80, startup_s=20)  # settled up to 1000 + 100
    died = restored_ledger((1000.0, cost_to_json(saved), False), now_wall=1130.0, now_mono=5.0)
    assert died.closed.downtime_s == pytest.approx(30.0)  # the daemon died with its job
    ended = restored_ledger((1000.0, cost_to_json(saved), True), now_wall=1130.0, now_mono=5.0)
    assert ended.closed.stopped_s == pytest.approx(30.0)  # stopped, completed or fatal
    assert ended.first_start == 1000.0 and ended.gap_since == 5.0
    fresh = restored_ledger((math.nan, {}, True), now_wall=1130.0, now_mono=5.0)
    assert fresh.first_start == 1130.0 and fresh.closed == Cost()
    back = restored_ledger((1000.0, cost_to_json(saved), True), now_wall=1050.0, now_mono=5.0)
    assert back.closed == saved  # a clock set back adds nothing


def test_the_status_line_names_the_causes_largest_first() -> None:
    view = goodput_view(
        Cost(productive_s=11075, redone_s=422, startup_s=190, downtime_s=41, stopped_s=0)
    )
    assert goodput_line(view) == (
        "goodput 94.4 % of 3h15m  (lost: redone 7m02s, startup 3m10s, downtime 41s, detection 0s)"
    )
    assert goodput_line(goodput_view(Cost())).startswith("goodput — of 0s")


POLICY = RestartConfig(backoff_initial_s=5.0, backoff_max_s=60.0)


def _after(step: int | None, history: RestartHistory) -> tuple[float, RestartHistory]:
    decision = decide(
        Verdict.CRASHED,
        exit_code=None,
        reached_first_step=True,
        progress_s=5.0,
        history=history,
        policy=POLICY,
        jitter=0.5,
        step=step,
    )
    return decision.delay_s, decision.history


def test_a_crash_after_new_progress_relaunches_at_once_and_a_loop_still_backs_off() -> None:
    delay, history = _after(50, RestartHistory())
    assert delay == 0.0  # the first run's best: new progress
    delay, history = _after(40, history)
    assert delay == pytest.approx(5.0)  # no new progress: backoff begins
    delay, history = _after(45, history)
    assert delay == pytest.approx(10.0)
    delay, history = _after(51, history)
    assert delay == 0.0  # past 50: new progress again, the chain starts over
    delay, history = _after(51, history)
    assert delay == pytest.approx(5.0)


def test_a_restart_torchrun_handled_itself_is_detection_downtime_and_redone() -> None:
    """Issue 41 (e): steps 1..38 every 0.1 s, a worker failure noticed at 5.0, the restarted
    worker steps again from 21 at 6.0 and passes 38 at 7.8; the run completes at 10.0."""
    progress = Progress(started_mono=0.0)
    for step in range(1, 39):
        progress, _ = progress.on_step(1.0 + step * 0.1, step=step, first=False, source="pattern")
    progress = progress.workers_restarting(5.0)
    progress = progress.workers_restarting(5.1)  # torchrun's "will restart" line: the same restart
    for step in range(21, 61):
        progress, _ = progress.on_step(
            6.0 + (step - 21) * 0.1, step=step, first=False, source="pattern"
        )
    (rec,) = progress.recoveries
    assert (rec.last_step, rec.failed, rec.resumed, rec.passed) == pytest.approx((4.8, 5, 6, 7.8))
    assert max(progress.intervals) < 0.2  # the restart gap is not a step interval
    times = RunTimes(
        launched=0.0,
        first_step=progress.first_step_mono,
        last_progress=progress.last_progress_mono,
        stepped=True,
        recoveries=tuple(progress.recoveries),
    )
    cost = run_cost(times, 10.0, ended=True, completed=True)
    assert cost.detection_s == pytest.approx(0.2)
    assert cost.downtime_s == pytest.approx(1.0)
    assert cost.redone_s == pytest.approx(1.8)
    assert cost.productive_s == pytest.approx(10.0 - 1.1 - 0.2 - 1.0 - 1.8)
    assert cost.total_s == pytest.approx(10.0)
    # a second failure before the first was passed again ends the first's redone stretch
    twice = RunTimes(
        launched=0.0,
        first_step=1.0,
        last_progress=9.0,
        stepped=True,
        recoveries=(Recovery(2.0, 2.5, 3.0, None), Recovery(4.0, 4.5, 5.0, 6.0)),
    )
    cost = run_cost(twice, 9.0, ended=False)
    assert (cost.detection_s, cost.downtime_s, cost.redone_s) == pytest.approx((1.0, 1.0, 2.0))
    assert cost.total_s == pytest.approx(9.0)
