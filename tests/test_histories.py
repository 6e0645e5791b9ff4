"""The daemon as histories: inputs in, effects out, through the model's one reducer.

Each test feeds :func:`~dflashd.supervisor.model.step.step` a history of what the loop hears
(a launch's answer, a child's death, a deadline, a stop) and reads the effects it asks the
executor for and the state it keeps: no process, pipe, thread or clock object.  The
real-process suites pin the adapters (custody, drains, the writer, spawn) and the CLI.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from typing import Any

import pytest

from dflashd.supervisor.model.deadlines import Deadline
from dflashd.supervisor.model.effects import (
    DumpStacks,
    Effect,
    EndRun,
    EndRunHung,
    KillHolders,
    KillRun,
    Launch,
    LookForRelease,
    NotifySystemd,
    Publish,
    RecordHistory,
    RunLaunched,
    SayLaunched,
    SendAlert,
    SetTimer,
    SignalRun,
    StopRun,
    UpdateLedger,
    WriteRecord,
)
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.goodput import GoodputLedger, RunTimes
from dflashd.supervisor.model.inputs import (
    ChildExited,
    DeadlineDue,
    DumpRead,
    Emptied,
    HangDumpWritten,
    LaunchPutOff,
    ReleaseLooked,
    Started,
    StopRequested,
)
from dflashd.supervisor.model.killing import DUMP_GRACE_S, STACKS_BOUND_S
from dflashd.supervisor.model.ledger import Ledger
from dflashd.supervisor.model.leftovers import LEFTOVER_GRACE_S, Leftovers
from dflashd.supervisor.model.lifecycle import State
from dflashd.supervisor.model.policy import RestartConfig
from dflashd.supervisor.model.runstate import RunFacts
from dflashd.supervisor.model.step import LAUNCH_RETRY_S, DaemonState, Rules, fold, step
from dflashd.supervisor.model.verdicts import EndedBy, Notice, Observations, Verdict
from tests.tables import launch_heard, play, run_state

POLICY = RestartConfig(early_retries=2, runtime_retries=5, backoff_initial_s=2.0)
CRASH = Observations(signal=signal.SIGSEGV, reached_first_step=True, output_lines=9)
EARLY = Observations(exit_code=1, output_lines=3, stderr_tail=("RuntimeError: boom",))
DONE = Observations(exit_code=0, reached_first_step=True, output_lines=9)
STOPPED = Observations(signal=15, ended_by=EndedBy.STOP, reached_first_step=True)


def fresh(**rules: Any) -> DaemonState:
    ledger = Ledger(goodput=GoodputLedger(first_start=1.0, gap_since=0.0))
    return DaemonState(rules=Rules(policy=POLICY, **rules), ledger=ledger)


def died(run_no: int, obs: Observations, at: float, *, started: float = 0.0) -> ChildExited:
    times = RunTimes(started, started + 1.0 if obs.reached_first_step else None, at - 0.5)
    facts = RunFacts(run_no, obs, at - started, ended_at=1000.0 + at, times=times, died_mono=at)
    return ChildExited(facts, jitter=0.0)


def kinds(effects: Sequence[Effect]) -> list[str]:
    """The effects' names, a record by its event."""
    return [
        f"WriteRecord({e.event.value})" if isinstance(e, WriteRecord) else type(e).__name__
        for e in effects
    ]


def test_a_crash_mid_training_is_relaunched_after_the_backoff_once_released() -> None:
    state, said = play(
        fresh(),
        [
            (0.0, Started()),
            (0.1, launch_heard(0.1)),
            (60.0, died(1, CRASH, 60.0, started=0.1)),
            (62.0, DeadlineDue(Deadline.RESTART)),
            (62.1, ReleaseLooked(None)),
        ],
    )
    start, launched, death, due, released = said
    assert kinds(start) == ["Launch"]  # starting and the cache flag are state, folded in
    assert kinds(launched) == ["RunLaunched", "Publish", "SayLaunched"]
    assert kinds(death) == [
        "WriteRecord(exit)",
        "RecordHistory",
        "WriteRecord(restart)",
        "SettleProcesses",
        "Publish",
    ]
    assert kinds(due) == ["LookForRelease"]
    assert kinds(released) == ["Launch"]
    assert state.loop.state is State.STARTING and state.ledger.restarts_by_verdict == {"crashed": 1}
    assert state.deadlines.restart_at is None  # taken when it came


def test_the_backoff_is_a_deadline_and_the_run_deadlines_die_with_the_run() -> None:
    state = fresh()
    for now, heard in ((0.0, Started()), (0.1, launch_heard(0.1))):
        state, _ = step(state, heard, now)
    state = step(state, DeadlineDue(Deadline.HANG), 5.0)[0]
    state, _ = fold(state, (SetTimer(Deadline.KILL, 70.0), SetTimer(Deadline.HANG, 80.0)), 6.0)
    assert (state.deadlines.kill_at, state.deadlines.hang_at) == (70.0, 80.0)
    state, _ = step(state, died(1, CRASH, 60.0, started=0.1), 60.0)
    assert state.deadlines.kill_at is None and state.deadlines.hang_at is None
    restart_at = state.deadlines.restart_at
    assert restart_at is not None and 60.0 < restart_at <= 60.0 + POLICY.backoff_initial_s
    assert state.deadlines.next_timeout(60.0) == pytest.approx(restart_at - 60.0)


def test_a_completed_job_ends_the_daemon_and_launches_nothing() -> None:
    state, said = play(
        fresh(), [(0.0, Started()), (0.1, launch_heard(0.1)), (9.0, died(1, DONE, 9.0))]
    )
    assert "Launch" not in kinds(said[-1]) and "SettleProcesses" in kinds(said[-1])
    assert state.loop.state is State.COMPLETED and state.loop.done and state.loop.exit_code == 0
    assert state.deadlines.restart_at is None


def test_early_deaths_past_the_budget_end_fatal_with_one_alert_each_kind() -> None:
    state = fresh(alerts_on=(Verdict.CRASH_BEFORE_FIRST_STEP, Notice.FATAL))
    alerts: list[str] = []
    at = 0.0
    for run_no in range(1, 5):
        state, _ = step(state, launch_heard(at), at)
        at += 3.0
        state, effects = step(state, died(run_no, EARLY, at, started=at - 3.0), at)
        alerts += [e.kind.value for e in effects if isinstance(e, SendAlert)]
        if state.loop.done:
            break
        at = state.deadlines.restart_at or at
        state, _ = step(state, DeadlineDue(Deadline.RESTART), at)
        state, _ = step(state, ReleaseLooked(None), at)
    assert state.loop.state is State.FATAL and state.loop.exit_code == 4
    assert alerts == ["crash_before_first_step", "fatal"]  # one incident, then the end
    assert state.ledger.fatal_reason is not None


@pytest.mark.parametrize("alive", [True, False])
def test_a_stop_ends_the_live_run_or_the_daemon_at_once(alive: bool) -> None:
    state, said = play(
        fresh(), [(0.0, Started()), (0.1, launch_heard(0.1)), (5.0, StopRequested(7.0, alive))]
    )
    stop = said[-1]
    signals = ["WriteRecord(stopping)", "SignalRun", "SignalRun"]  # SIGTERM, SIGCONT
    assert kinds(stop) == (
        ["NotifySystemd", *signals, "Publish"] if alive else ["NotifySystemd", "Publish"]
    )
    assert (state.deadlines.stop_at == 12.0) is alive  # the grace, then the stacks and the kill
    assert isinstance(stop[0], NotifySystemd) and stop[0].text == "STOPPING=1"
    assert state.loop.stop_requested
    assert state.loop.state is (State.STOPPING if alive else State.STOPPED)
    assert state.ledger.goodput.stop_at == 5.0
    again, effects = step(state, StopRequested(7.0, alive), 6.0)
    assert effects == () and again == state  # a second stop changes nothing


def test_a_stopped_run_ends_the_daemon_and_is_not_relaunched() -> None:
    state, said = play(
        fresh(),
        [
            (0.0, Started()),
            (0.1, launch_heard(0.1)),
            (5.0, StopRequested(7.0, alive=True)),
            (6.0, died(1, STOPPED, 6.0, started=0.1)),
        ],
    )
    assert "Launch" not in kinds(said[-1]) and state.loop.state is State.STOPPED
    assert state.deadlines.restart_at is None and state.deadlines.stop_at is None


def test_the_stop_timeout_asks_for_the_stacks_then_the_kill() -> None:
    state, said = play(
        fresh(),
        [
            (0.0, Started()),
            (0.1, launch_heard(0.1)),
            (5.0, StopRequested(7.0, alive=True)),
            (12.0, DeadlineDue(Deadline.STOP)),
        ],
    )
    dump, record = said[-1]
    assert dump == DumpStacks("stop_timeout", "1-1", before_kill=True)
    assert isinstance(record, WriteRecord) and record.event is Event.STOP_TIMEOUT
    assert state.deadlines.stop_at is None and state.deadlines.kill_at == 12.0 + STACKS_BOUND_S
    assert state.run is not None and state.run.dump_before_kill == "1-1"
    said_back = WriteRecord(Event.STACKS, {"dump_id": "1-1"})
    state, read = step(
        state, DumpRead(1, "1-1", said_back, {"top": []}, True, "stop_timeout", None, True), 13.0
    )
    assert read == (said_back, KillRun())  # the dump is in: the kill, its timer cleared
    assert state.deadlines.kill_at is None and state.run is not None
    assert state.run.stacks == {"top": []} and state.run.dump_before_kill is None


def test_transition_stopping_to_killed_without_py_spy_is_at_once() -> None:
    _state, said = play(
        fresh(no_dumps="unavailable: py-spy not found"),
        [
            (0.0, Started()),
            (0.1, launch_heard(0.1)),
            (5.0, StopRequested(7.0, alive=True)),
            (12.0, DeadlineDue(Deadline.STOP)),
        ],
    )
    assert said[-1] == [WriteRecord(Event.STOP_TIMEOUT, {"signal": "SIGKILL"}), KillRun()]


@pytest.mark.parametrize(
    ("ok", "awaited", "alive", "then"),
    [
        (True, True, True, ["WriteRecord(stacks)", "KillRun"]),
        (
            False,
            True,
            True,
            ["WriteRecord(stacks)", "WriteRecord(ending_run)", "SignalRun", "SignalRun"],
        ),
        (True, True, False, ["WriteRecord(stacks)"]),  # died meanwhile: kept, nothing to kill
        (True, False, True, ["WriteRecord(stacks)"]),  # a dump the kill does not wait for
    ],
)
def test_transition_ending_after_a_dump(
    ok: bool, awaited: bool, alive: bool, then: list[str]
) -> None:
    """A stall ends the run: the dump first (named by the model), then the kill; a dump py-spy
    could not take is followed by faulthandler's (SIGABRT, SIGCONT), the kill 3 s later."""
    state, _ = play(fresh(), [(0.0, Started()), (0.1, launch_heard(0.1))])
    state, ending = fold(state, (EndRun(EndedBy.NO_PROGRESS),), 1.0)  # a stall's end, decided
    assert kinds(ending) == ["DumpStacks", "WriteRecord(ending_run)"]
    dump_id = "1-1" if awaited else "1-9"
    said_back = WriteRecord(Event.STACKS, {"dump_id": dump_id})
    read = DumpRead(
        1, dump_id, said_back, {"top": []}, ok, "no_progress", None if ok else "seccomp", alive
    )
    state, effects = step(state, read, 2.0)
    assert kinds(effects) == then
    if not ok:
        assert state.deadlines.kill_at == 2.0 + DUMP_GRACE_S


def test_a_launch_put_off_keeps_its_number_and_clears_the_cache_on_the_retry() -> None:
    state = step(fresh(), died(1, EARLY, 2.0), 2.0)[0]
    state = fold(state, (UpdateLedger(clear_cache_next=True),), 2.0)[0]  # caches to clear
    state, effects = step(state, DeadlineDue(Deadline.RESTART), 4.0)
    state, effects = step(state, ReleaseLooked(None), 4.0)
    (launch,) = effects
    assert isinstance(launch, Launch) and launch.clear_cache and launch.run_no is None
    state, effects = step(state, LaunchPutOff(2, "EMFILE", 8, launch.clear_cache), 4.0)
    assert kinds(effects) == ["WriteRecord(launch_deferred)"]
    assert state.deferred_run_no == 2 and state.ledger.clear_cache_next
    assert state.deadlines.restart_at == pytest.approx(4.0 + LAUNCH_RETRY_S)
    state, effects = step(state, DeadlineDue(Deadline.RESTART), 5.0)
    assert effects == (LookForRelease(),)
    state, effects = step(state, ReleaseLooked(None), 5.0)
    (retry,) = effects
    assert isinstance(retry, Launch) and (retry.run_no, retry.clear_cache) == (2, True)
    assert state.deferred_run_no is None and not state.ledger.clear_cache_next


def test_a_dead_run_still_holding_the_gpu_is_looked_at_again_or_at_once_when_emptied() -> None:
    state = step(fresh(), died(1, CRASH, 60.0), 60.0)[0]
    state, effects = step(state, DeadlineDue(Deadline.RESTART), 62.0)
    left = Leftovers(1, ((77, "python train.py"),), "cgroup")
    state, effects = step(state, ReleaseLooked(left), 62.0)  # processes left: SIGTERM, a grace
    assert kinds(effects)[0] == "WriteRecord(ending_leftovers)"
    assert state.deadlines.release_check_at == 62.0 + LEFTOVER_GRACE_S
    state, effects = step(state, Emptied(run_no=1, current_run_no=1, current_alive=False), 63.0)
    assert effects == (LookForRelease(),) and state.deadlines.release_check_at is None
    _, effects = step(state, ReleaseLooked(None), 63.1)  # none left: launched
    assert any(isinstance(e, Launch) for e in effects)
    _, effects = step(state, Emptied(run_no=1, current_run_no=1, current_alive=False), 63.5)
    assert effects == ()  # no look was waiting: nothing to do


def test_the_watchdog_pets_systemd_and_sets_its_next_deadline() -> None:
    state = fresh(watchdog_every_s=15.0)
    state, effects = step(state, DeadlineDue(Deadline.WATCHDOG), 100.0)
    assert effects == (NotifySystemd("WATCHDOG=1"),)
    assert state.deadlines.watchdog_at == 115.0


def test_a_spawn_failure_is_current_and_concluded_in_one_step() -> None:
    state = step(fresh(), Started(), 0.0)[0]
    facts = RunFacts(1, Observations(spawn_error="No such file"), 0.0, ended_at=1000.0)
    state, effects = step(state, ChildExited(facts, 0.0, launched=run_state(0.0)), 0.0)
    assert isinstance(effects[0], RunLaunched)  # the run is the current one from now on
    assert any(isinstance(e, WriteRecord) and e.event is Event.EXIT for e in effects)
    assert any(isinstance(e, RecordHistory) for e in effects) and Publish() in effects
    assert effects[-1] == SayLaunched(
        "No such file"
    )  # start's client hears of it after the records
    assert not any(isinstance(e, Launch | StopRun | SignalRun) for e in effects)


@pytest.mark.parametrize(
    ("looks", "then"),
    [
        # (seconds after the first look, what that look asks for)
        (
            (0.0,),
            [
                "WriteRecord(ending_leftovers)",
                "KillHolders",
                "SignalLeftovers",
                "SignalLeftovers",
                "WatchEmpty",
            ],
        ),
        ((0.0, 1.0), []),  # within the grace: looked at again shortly
        ((0.0, 3.0), ["KillRun"]),  # the grace is over: SIGKILL to all of it
        ((0.0, 3.0, 10.0), ["WriteRecord(leftover_processes)", "LookForRelease"]),  # given up
    ],
)
def test_transition_leftovers_term_then_kill_then_give_up(
    looks: tuple[float, ...], then: list[str]
) -> None:
    """Issue 52: the leftovers' escalation, once in the shell (endedruns.py), is the model's:
    SIGTERM (a compile worker SIGKILLed at once), SIGKILL after 3 s, given up after 10 s (the
    relaunch goes ahead, past them)."""
    state = step(fresh(), died(1, CRASH, 60.0), 60.0)[0]
    state = step(state, DeadlineDue(Deadline.RESTART), 62.0)[0]
    named = ((77, "python train.py"), (78, "python -m torch/_inductor/compile_worker/__main__"))
    effects: tuple[Effect, ...] = ()
    for after in looks:
        state, effects = step(state, ReleaseLooked(Leftovers(1, named, "pidfd")), 62.0 + after)
    assert kinds(effects) == then
    if then and then[0] == "WriteRecord(ending_leftovers)":
        assert effects[1] == KillHolders((78,))  # the stateless one at once
    if then and then[-1] == "LookForRelease":
        assert effects[-1] == LookForRelease(past_leftovers=True) and state.leftovers_since is None


@pytest.mark.parametrize("alive", [True, False])
def test_transition_proven_hang_to_killed_after_its_dump_is_written(alive: bool) -> None:
    """Issue 52: a proven hang's kill is the model's, on the turn its proving sample's files
    are written (the record of the dump, the run's stacks, the ending record, SIGKILL)."""
    hung = EndRunHung("every thread waits, unmoved", ("train.py:40 wait",), 6.2)
    state, _ = play(fresh(), [(0.0, Started()), (0.1, launch_heard(0.1))])
    state, acting = fold(state, (hung,), 9.0)  # a proven hang's end, decided
    assert list(acting) == [hung] and state.run is not None and state.run.ended_by is EndedBy.HUNG
    record = WriteRecord(Event.STACKS, {"dump_id": "hang"})
    state, effects = step(state, HangDumpWritten(1, record, {"top": ["t"]}, alive), 9.1)
    if not alive:
        assert effects == () and state.hung_end is None
        return
    assert kinds(effects) == ["WriteRecord(stacks)", "WriteRecord(ending_run)", "KillRun"]
    ending = effects[1]
    assert isinstance(ending, WriteRecord) and ending.fields["hung_after_s"] == 6.2
    assert state.run is not None and state.run.stacks == {"top": ["t"]} and state.hung_end is None
