"""The end of a run, decided by one pure function: a table of facts -> effects, no process, no clock.

Verdict x history x stop x alert config: each row says which state the loop enters, which
alerts go out, which records follow the ``exit``, and how the ledger changes.
"""

from __future__ import annotations

import signal

import pytest

from dflashd.supervisor.model.effects import RecordHistory, SendAlert, SettleProcesses, WriteRecord
from dflashd.supervisor.model.ending import conclude, lost_facts
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.exitcodes import EXIT_FATAL
from dflashd.supervisor.model.incidents import passed, resumed
from dflashd.supervisor.model.ledger import Ledger, UpdateLedger
from dflashd.supervisor.model.lifecycle import State
from dflashd.supervisor.model.policy import RestartConfig, RestartHistory
from dflashd.supervisor.model.runstate import RunFacts
from dflashd.supervisor.model.verdicts import (
    DEFAULT_ALERTS,
    AlertKind,
    EndedBy,
    Notice,
    Observations,
    Verdict,
)

POLICY = RestartConfig(early_retries=3, runtime_retries=5, backoff_initial_s=10.0)
FATAL_ONLY = (Notice.FATAL,)
IMPORT_ERROR = ("ModuleNotFoundError: No module named 'x'",)

RUNTIME_CRASH = Observations(signal=signal.SIGSEGV, reached_first_step=True, output_lines=9)
EARLY_CRASH = Observations(exit_code=1, output_lines=3, stderr_tail=("RuntimeError: boom",))
UNFIXABLE = Observations(exit_code=1, output_lines=3, stderr_tail=IMPORT_ERROR)
STALL = Observations(signal=9, ended_by=EndedBy.NO_PROGRESS, reached_first_step=True)
DONE = Observations(exit_code=0, reached_first_step=True, output_lines=9)
STOP = Observations(signal=15, ended_by=EndedBy.STOP, reached_first_step=True)
AGAIN = RestartHistory(early_deaths=1, consecutive_failures=1)  # one early death before
SPENT = RestartHistory(early_deaths=3, consecutive_failures=3)  # the early budget is used up


@pytest.mark.parametrize(
    ("obs", "history", "stop", "alerts_on", "state", "alerts", "after_exit"),
    [
        # a runtime crash: restart, no page by default (crashed is not in alerts.on)
        (RUNTIME_CRASH, RestartHistory(), False, DEFAULT_ALERTS, State.BACKOFF, [], ["restart"]),
        # the first early death pages; the second of a loop does not; the last one is fatal
        (
            EARLY_CRASH,
            RestartHistory(),
            False,
            DEFAULT_ALERTS,
            State.BACKOFF,
            [("crash_before_first_step", "RuntimeError")],
            ["restart"],
        ),
        (EARLY_CRASH, AGAIN, False, DEFAULT_ALERTS, State.BACKOFF, [], ["restart"]),
        (
            EARLY_CRASH,
            SPENT,
            False,
            DEFAULT_ALERTS,
            State.FATAL,
            [("fatal", "early_retries_exhausted")],
            ["fatal"],
        ),
        # unfixable: fatal at once, with one alert (the fatal one)
        (
            UNFIXABLE,
            RestartHistory(),
            False,
            DEFAULT_ALERTS,
            State.FATAL,
            [("fatal", "unfixable_import_error")],
            ["fatal"],
        ),
        # ... and where fatal is not alerted, the verdict's own alert goes out instead
        (
            UNFIXABLE,
            RestartHistory(),
            False,
            (Verdict.CRASH_BEFORE_FIRST_STEP,),
            State.FATAL,
            [("crash_before_first_step", "import_error")],
            ["fatal"],
        ),
        (UNFIXABLE, RestartHistory(), False, (), State.FATAL, [], ["fatal"]),
        # a stall pages by default, not when alerts.on names only fatal
        (
            STALL,
            RestartHistory(),
            False,
            DEFAULT_ALERTS,
            State.BACKOFF,
            [("stalled", "no_progress")],
            ["restart"],
        ),
        (STALL, RestartHistory(), False, FATAL_ONLY, State.BACKOFF, [], ["restart"]),
        # completed and stopped end the daemon; a stop request wins over any verdict
        (DONE, RestartHistory(), False, DEFAULT_ALERTS, State.COMPLETED, [], ["done"]),
        (STOP, RestartHistory(), True, DEFAULT_ALERTS, State.STOPPED, [], []),
        (RUNTIME_CRASH, RestartHistory(), True, DEFAULT_ALERTS, State.STOPPED, [], []),
        (
            EARLY_CRASH,
            RestartHistory(),
            True,
            DEFAULT_ALERTS,
            State.STOPPED,
            [("crash_before_first_step", "RuntimeError")],
            [],
        ),
    ],
)
def test_conclude_table(
    obs: Observations,
    history: RestartHistory,
    stop: bool,
    alerts_on: tuple[AlertKind, ...],
    state: State,
    alerts: list[tuple[str, str]],
    after_exit: list[str],
) -> None:
    facts = RunFacts(3, obs, 42.0, ended_at=1000.0, step=None, stop_requested=stop)
    outcome = conclude(facts, history=history, policy=POLICY, alerts_on=alerts_on, jitter=0.5)
    assert outcome.next_state is state
    assert [(k.value, why) for k, why in outcome.alerts] == alerts
    assert [e.value for e in outcome.records] == ["exit", *after_exit]
    first, second = outcome.effects[0], outcome.effects[1]
    assert isinstance(first, WriteRecord) and first.wait_s is not None  # exit, on disk first
    assert isinstance(second, RecordHistory) and second.ended_at == 1000.0
    assert outcome.book.last_exit is not None and outcome.book.last_exit["run"] == 3
    counted = outcome.book.counted_verdict
    assert counted == (outcome.result.verdict.value if state is State.BACKOFF else None)
    ends_daemon = state in (State.FATAL, State.STOPPED, State.COMPLETED)
    expected_code = (EXIT_FATAL if state is State.FATAL else 0) if ends_daemon else None
    assert outcome.daemon_exit_code == expected_code
    assert (outcome.restart_delay_s is not None) is (state is State.BACKOFF)
    settle = [e for e in outcome.effects if isinstance(e, SettleProcesses)]
    assert settle == [SettleProcesses(kill_now=obs.ended_by is not EndedBy.CHILD)]


def test_a_restart_after_a_stall_waits_for_the_recovery() -> None:
    facts = RunFacts(1, STALL, 900.0, ended_at=1.0, step=40)
    outcome = conclude(
        facts, history=RestartHistory(), policy=POLICY, alerts_on=DEFAULT_ALERTS, jitter=0.0
    )
    ledger = Ledger()
    ledger = ledger.took(outcome.book)
    assert ledger.recovering_from == "stalled"
    assert ledger.restarts_by_verdict == {"stalled": 1} and ledger.restarts_this_daemon == 1
    effects = resumed(
        ledger.recovering_from,
        alerts_on=DEFAULT_ALERTS,
        already_alerted=frozenset(),
        last_exit=ledger.last_exit,
        step=41,
    )
    sent = [e for e in effects if isinstance(e, SendAlert)]
    assert [e.kind.value for e in sent] == ["recovered"]
    assert sent[0].reason.startswith("recovered from stalled: run 1 stalled (") and sent[
        0
    ].reason.endswith("at step 40; training is at step 41"), sent[0].reason
    assert sent[0].fields["recovered_from"]["verdict"] == "stalled"
    quiet = resumed(ledger.recovering_from, alerts_on=FATAL_ONLY, already_alerted=frozenset())
    assert quiet == (UpdateLedger(recovered=True),)  # the book only: nothing sent
    ledger = ledger.took(UpdateLedger(recovered=True))
    assert ledger.recovering_from is None
    # no stall to recover from: the incident closes, nobody is told
    assert resumed(None, alerts_on=DEFAULT_ALERTS, already_alerted=frozenset()) == (
        UpdateLedger(recovered=True),
    )


def test_one_stuck_job_is_one_incident_one_alert_then_the_fatal() -> None:
    """Stalled at step 3, again and again: ``stalled`` once, no ``recovered``, then ``fatal``."""
    ledger = Ledger()
    policy = RestartConfig(no_progress_restarts=3, backoff_initial_s=0.0)
    sent: list[str] = []
    for run in range(1, 5):
        assert not passed(ledger.incident, 1)  # each relaunch steps 1-3: never past 3
        facts = RunFacts(run, STALL, 10.0, ended_at=float(run), step=3)
        outcome = conclude(
            facts,
            history=ledger.history,
            policy=policy,
            alerts_on=DEFAULT_ALERTS,
            jitter=0.0,
            incident=ledger.incident,
        )
        for effect in outcome.effects:
            if isinstance(effect, UpdateLedger):
                ledger = ledger.took(effect)
        sent += [kind.value for kind, _ in outcome.alerts]
    assert sent == ["stalled", "fatal"]
    assert ledger.fatal_reason == "no_progress_past_step_3"


def test_an_incident_ends_when_a_run_passes_its_step() -> None:
    ledger = Ledger()
    on = (*DEFAULT_ALERTS, Verdict.CRASHED)
    for run, step in ((1, 100), (2, 80)):
        facts = RunFacts(run, RUNTIME_CRASH, 10.0, ended_at=1.0, step=step)
        outcome = conclude(
            facts,
            history=ledger.history,
            policy=POLICY,
            alerts_on=on,
            jitter=0.0,
            incident=ledger.incident,
        )
        ledger = ledger.took(outcome.book)
        assert [k.value for k, _ in outcome.alerts] == (["crashed"] if run == 1 else [])
    assert ledger.incident is not None and ledger.incident.step == 100
    assert not passed(ledger.incident, 100) and passed(ledger.incident, 101)
    ledger = ledger.took(UpdateLedger(recovered=True))
    facts = RunFacts(3, RUNTIME_CRASH, 10.0, ended_at=1.0, step=150)
    outcome = conclude(facts, history=ledger.history, policy=POLICY, alerts_on=on, jitter=0.0)
    assert [k.value for k, _ in outcome.alerts] == ["crashed"]  # a new incident pages again


def test_a_lost_run_is_classified_and_counted_like_any_other() -> None:
    outcome = conclude(
        lost_facts(7, 120, 50.0),
        history=RestartHistory(),
        policy=POLICY,
        alerts_on=(*DEFAULT_ALERTS, Verdict.LOST),
        jitter=0.0,
    )
    assert outcome.result.verdict.value == "lost" and outcome.result.reason == "daemon_killed"
    assert outcome.exit_fields["duration_s"] is None and outcome.exit_fields["step"] == 120
    assert outcome.book.counted_verdict == "lost"
    assert outcome.next_state is None and outcome.restart_delay_s is None  # the start launches
    assert [(k.value, why) for k, why in outcome.alerts] == [("lost", "daemon_killed")]
    assert outcome.records == (Event.EXIT,)


def test_a_start_up_that_died_on_a_stale_build_lock_is_not_relaunched_into_it() -> None:
    """Issue 41: torch would wait on the same lock again; one fatal naming the path instead."""
    lock = "/root/.cache/torch_extensions/py311_cpu/cpu_adam/lock"
    stuck = Observations(signal=9, ended_by=EndedBy.FIRST_STEP_TIMEOUT, output_lines=3)
    facts = RunFacts(1, stuck, 3600.0, ended_at=1.0, stale_build_locks=(lock,))
    outcome = conclude(
        facts, history=RestartHistory(), policy=POLICY, alerts_on=DEFAULT_ALERTS, jitter=0.0
    )
    assert outcome.decision is not None and outcome.decision.reason == f"stale_build_lock:{lock}"
    assert any(isinstance(e, SendAlert) and e.kind is Notice.FATAL for e in outcome.effects)
    assert outcome.exit_fields["stale_build_locks"] == [lock]
    # without the lock the same death is relaunched
    again = conclude(
        RunFacts(1, stuck, 3600.0, ended_at=1.0),
        history=RestartHistory(),
        policy=POLICY,
        alerts_on=DEFAULT_ALERTS,
        jitter=0.0,
    )
    assert again.decision is not None and again.decision.action.value == "restart"


def test_a_crash_right_after_a_wait_elsewhere_says_so_in_one_waiting_alert() -> None:
    """Issue 41: the node whose peer was ended first sees its collective fail; its exit
    record and its one alert name the wait (``crashed`` itself is not alerted by default)."""
    why = "rank(s) [0] of 2 wait in recv for ranks on other nodes"
    crash = Observations(exit_code=1, reached_first_step=True, output_lines=9)
    facts = RunFacts(1, crash, 95.0, ended_at=1.0, waited_elsewhere=(why, 70.0))
    outcome = conclude(
        facts, history=RestartHistory(), policy=POLICY, alerts_on=DEFAULT_ALERTS, jitter=0.0
    )
    sent = [e for e in outcome.effects if isinstance(e, SendAlert)]
    assert [e.kind for e in sent] == [Notice.WAITING]
    assert "after waiting 70s on work elsewhere" in sent[0].reason and why in sent[0].reason
    assert outcome.exit_fields["waited_elsewhere"] == {"why": why, "for_s": 70.0}
    already = RunFacts(
        1,
        crash,
        95.0,
        ended_at=1.0,
        waited_elsewhere=(why, 70.0),
        already_alerted=frozenset({Notice.WAITING}),
    )
    again = conclude(
        already, history=RestartHistory(), policy=POLICY, alerts_on=DEFAULT_ALERTS, jitter=0.0
    )
    assert not [e for e in again.effects if isinstance(e, SendAlert)]  # said once already


def test_a_wait_elsewhere_is_timed_from_the_last_step_not_from_the_round_that_named_it() -> None:
    """A rank 25 s into its barrier when its peer's node died: the round that found the wait
    came 20 s into the silence, and the end's reason says 25 s, not 5."""
    from dataclasses import replace

    from dflashd.supervisor.model.died import waited_elsewhere
    from dflashd.supervisor.model.hang import HangWatch
    from tests.tables import run_state

    run = run_state(0.0)
    run = replace(run, progress=replace(run.progress, last_progress_mono=100.0))
    watch = HangWatch(elsewhere_last=("rank(s) [1] of 2 wait in barrier", 120.0, 120.0))
    assert waited_elsewhere(run, watch, 125.0) == ("rank(s) [1] of 2 wait in barrier", 25.0)
    never_stepped = replace(run, progress=replace(run.progress, last_progress_mono=None))
    assert waited_elsewhere(never_stepped, watch, 125.0) == (
        "rank(s) [1] of 2 wait in barrier",
        5.0,
    )
