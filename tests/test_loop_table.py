"""What each input asks of the daemon in each of its states, as a table through the reducer.

A row: the state the daemon is in (reached by a short history), what it hears, the effects it
asks the executor for (by name; a record by its event), the loop's state after, and which of
the daemon's own deadlines are set after.  Then two small deciders' tables: whether a
verdict pages, and a torchrun job's first failed worker's exit code.  No process, file or clock.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence

import pytest

from dflashd.supervisor.model.deadlines import Deadline
from dflashd.supervisor.model.effects import Effect, WriteRecord
from dflashd.supervisor.model.exitcodes import worker_exit_code
from dflashd.supervisor.model.goodput import GoodputLedger, RunTimes
from dflashd.supervisor.model.incidents import alert_decision
from dflashd.supervisor.model.inputs import (
    ChildExited,
    DeadlineDue,
    Emptied,
    Input,
    LaunchPutOff,
    ReleaseLooked,
    Started,
    StatusChanged,
    StatusWritten,
    StopRequested,
)
from dflashd.supervisor.model.ledger import Ledger
from dflashd.supervisor.model.leftovers import Leftovers
from dflashd.supervisor.model.policy import RestartConfig
from dflashd.supervisor.model.runstate import RunFacts
from dflashd.supervisor.model.step import DaemonState, Rules, step
from dflashd.supervisor.model.verdicts import (
    DEFAULT_ALERTS,
    AlertKind,
    Notice,
    Observations,
    Verdict,
)
from tests.tables import launch_heard

LEFT = Leftovers(
    1, ((4242, "python worker.py"),), "cgroup"
)  # a dead run's leftover, as its custody names it

POLICY = RestartConfig(backoff_initial_s=2.0)


def _death(obs: Observations, at: float, step_no: int | None = None) -> ChildExited:
    times = RunTimes(0.1, 1.0 if obs.reached_first_step else None, at - 0.5)
    facts = RunFacts(1, obs, at, ended_at=1e9 + at, step=step_no, times=times, died_mono=at)
    return ChildExited(facts, jitter=0.5)


CRASH_NO_PROGRESS = _death(Observations(signal=signal.SIGSEGV, reached_first_step=True), 60.0)
FATAL_78 = _death(Observations(exit_code=78, reached_first_step=True), 60.0)

# The states, each reached by what the loop heard (at these times).
HISTORIES: dict[str, list[tuple[float, Input]]] = {
    "fresh": [],
    "running": [(0.0, Started()), (0.1, launch_heard(0.1))],
    "backoff": [(0.0, Started()), (0.1, launch_heard(0.1)), (60.0, CRASH_NO_PROGRESS)],
    "restart due": [
        (0.0, Started()),
        (0.1, launch_heard(0.1)),
        (60.0, CRASH_NO_PROGRESS),
        (62.0, DeadlineDue(Deadline.RESTART)),
    ],
    "waiting for release": [
        (0.0, Started()),
        (0.1, launch_heard(0.1)),
        (60.0, CRASH_NO_PROGRESS),
        (62.0, DeadlineDue(Deadline.RESTART)),
        (62.0, ReleaseLooked(LEFT)),  # SIGTERM to what run 1 left; looked at again
    ],
    "stopping": [(0.0, Started()), (0.1, launch_heard(0.1)), (5.0, StopRequested(30.0, True))],
    "fatal": [(0.0, Started()), (0.1, launch_heard(0.1)), (60.0, FATAL_78)],
}


def reached(name: str) -> DaemonState:
    ledger = Ledger(goodput=GoodputLedger(first_start=1.0, gap_since=0.0))
    state = DaemonState(rules=Rules(policy=POLICY, watchdog_every_s=10.0), ledger=ledger)
    for now, heard in HISTORIES[name]:
        state, _ = step(state, heard, now)
    return state


def names(effects: Sequence[Effect]) -> list[str]:
    return [
        f"WriteRecord({e.event.value})" if isinstance(e, WriteRecord) else type(e).__name__
        for e in effects
    ]


def deadlines_set(state: DaemonState) -> list[str]:
    table = state.deadlines
    at = {
        "restart": table.restart_at,
        "release": table.release_check_at,
        "stop": table.at(Deadline.STOP),
        "watchdog": table.at(Deadline.WATCHDOG),
        "kill": table.at(Deadline.KILL),
    }
    return [name for name, when in at.items() if when is not None]


# (in state, hears, asks for, state after, deadlines set after)
ROWS: list[tuple[str, Input, list[str], str, list[str]]] = [
    ("fresh", Started(), ["Launch"], "starting", []),
    ("fresh", StopRequested(30.0, False), ["NotifySystemd", "Publish"], "stopped", []),
    ("fresh", DeadlineDue(Deadline.WATCHDOG), ["NotifySystemd"], "starting", ["watchdog"]),
    (
        "running",
        StopRequested(30.0, True),
        ["NotifySystemd", "WriteRecord(stopping)", "SignalRun", "SignalRun", "Publish"],
        "stopping",
        ["stop"],
    ),
    ("running", DeadlineDue(Deadline.WATCHDOG), ["NotifySystemd"], "running", ["watchdog"]),
    ("running", DeadlineDue(Deadline.KILL), ["KillRun"], "running", []),  # a dump past its bound
    ("running", DeadlineDue(Deadline.HANG), [], "running", []),
    ("running", Emptied(1, 1, True), [], "running", []),  # no release awaited
    ("running", StatusChanged(), [], "running", []),
    ("running", StatusWritten(), [], "running", []),
    ("backoff", DeadlineDue(Deadline.RESTART), ["LookForRelease"], "backoff", []),
    ("backoff", StopRequested(30.0, False), ["NotifySystemd", "Publish"], "stopped", []),
    ("backoff", ReleaseLooked(None), ["Launch"], "starting", []),  # no stale timer
    ("restart due", ReleaseLooked(None), ["Launch"], "starting", []),
    (
        "restart due",
        ReleaseLooked(LEFT),
        [
            "WriteRecord(ending_leftovers)",
            "KillHolders",
            "SignalLeftovers",
            "SignalLeftovers",
            "WatchEmpty",
        ],
        "backoff",
        ["release"],
    ),
    ("restart due", StopRequested(30.0, False), ["NotifySystemd", "Publish"], "stopped", []),
    (
        "backoff",
        LaunchPutOff(2, "out of file descriptors", 3, True),
        ["WriteRecord(launch_deferred)"],
        "backoff",
        ["restart"],
    ),
    ("waiting for release", Emptied(1, 1, False), ["LookForRelease"], "backoff", []),
    ("waiting for release", Emptied(1, 2, True), [], "backoff", ["release"]),  # a newer run
    ("waiting for release", DeadlineDue(Deadline.RELEASE_CHECK), ["LookForRelease"], "backoff", []),
    (  # still there 38 s after they were found: said, and the relaunch goes ahead
        "waiting for release",
        ReleaseLooked(LEFT),
        ["WriteRecord(leftover_processes)", "LookForRelease"],
        "backoff",
        ["release"],
    ),
    (
        "waiting for release",
        StopRequested(30.0, False),
        ["NotifySystemd", "Publish"],
        "stopped",
        [],
    ),
    ("stopping", StopRequested(30.0, True), [], "stopping", ["stop"]),  # asked twice: once
    # the grace is over: the stacks, the kill when they are in (model/killing.py)
    (
        "stopping",
        DeadlineDue(Deadline.STOP),
        ["DumpStacks", "WriteRecord(stop_timeout)"],
        "stopping",
        ["kill"],
    ),
    (
        "stopping",
        DeadlineDue(Deadline.WATCHDOG),
        ["NotifySystemd"],
        "stopping",
        ["stop", "watchdog"],
    ),
    ("fatal", StopRequested(30.0, False), [], "fatal", []),
    ("fatal", DeadlineDue(Deadline.WATCHDOG), ["NotifySystemd"], "fatal", ["watchdog"]),
]


@pytest.mark.parametrize(
    ("before", "heard", "asks", "after", "deadlines"),
    ROWS,
    ids=[
        f"{r[0]}: {type(r[1]).__name__}"
        + (f"({r[1].deadline})" if isinstance(r[1], DeadlineDue) else "")
        for r in ROWS
    ],
)
def test_what_the_daemon_does_with_what_it_hears(
    before: str, heard: Input, asks: list[str], after: str, deadlines: list[str]
) -> None:
    state, effects = step(reached(before), heard, 100.0)
    assert names(effects) == asks
    assert str(state.loop.state) == after
    assert deadlines_set(state) == deadlines


def test_a_deferred_launch_keeps_its_number_and_its_cache_clearing() -> None:
    state, _ = step(reached("backoff"), LaunchPutOff(2, "EMFILE", 3, True), 100.0)
    assert state.deferred_run_no == 2 and state.ledger.clear_cache_next
    assert state.deadlines.restart_at == 101.0  # tried again a second later
    state, effects = step(state, ReleaseLooked(None), 101.0)
    launch = next(e for e in effects if type(e).__name__ == "Launch")
    assert launch.run_no == 2 and launch.clear_cache  # type: ignore[attr-defined]
    assert state.deferred_run_no is None and not state.ledger.clear_cache_next


# (kind, alerts.on, already alerted for this run, early deaths before, pages?)
PAGES: list[tuple[AlertKind, tuple[AlertKind, ...], frozenset[AlertKind], int, bool]] = [
    (Verdict.CRASH_BEFORE_FIRST_STEP, DEFAULT_ALERTS, frozenset(), 0, True),
    (Verdict.CRASH_BEFORE_FIRST_STEP, DEFAULT_ALERTS, frozenset(), 1, False),  # a loop: quiet
    (Verdict.SILENT_DEATH, DEFAULT_ALERTS, frozenset(), 2, False),
    (Verdict.NO_GPU_MEMORY, DEFAULT_ALERTS, frozenset(), 1, False),
    (Verdict.STALLED, DEFAULT_ALERTS, frozenset(), 3, True),  # not an early death
    (Verdict.CRASHED, DEFAULT_ALERTS, frozenset(), 0, False),  # not on by default
    (Verdict.CRASHED, (Verdict.CRASHED,), frozenset(), 0, True),
    (Notice.FATAL, DEFAULT_ALERTS, frozenset(), 5, True),  # the end of a loop always pages
    (Notice.FATAL, DEFAULT_ALERTS, frozenset({Notice.FATAL}), 0, False),  # once per run
    (Notice.RECOVERED, DEFAULT_ALERTS, frozenset(), 0, True),
    (Notice.RECOVERED, (Notice.FATAL,), frozenset(), 0, False),  # recovered obeys alerts.on
    (Notice.WAITING, DEFAULT_ALERTS, frozenset(), 0, True),
    (Notice.SLOW, DEFAULT_ALERTS, frozenset({Notice.SLOW}), 0, False),
    (Verdict.COMPLETED, DEFAULT_ALERTS, frozenset(), 0, False),
    (Verdict.STOPPED, DEFAULT_ALERTS, frozenset(), 0, False),
]


@pytest.mark.parametrize(("kind", "on", "already", "early_before", "pages"), PAGES)
def test_whether_a_verdict_pages(
    kind: AlertKind,
    on: tuple[AlertKind, ...],
    already: frozenset[AlertKind],
    early_before: int,
    pages: bool,
) -> None:
    decided = alert_decision(kind, on=on, already_alerted=already, early_deaths_before=early_before)
    assert decided is pages


SUMMARY_HEAD = ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:", "=" * 20)


@pytest.mark.parametrize(
    ("tail", "code"),
    [
        (
            (
                *SUMMARY_HEAD,
                "Root Cause (first observed failure):",
                "[1]:",
                "  exitcode  : 78 (pid: 9)",
            ),
            78,
        ),
        (
            (*SUMMARY_HEAD, "Root Cause (first observed failure):", "  exitcode  : -11 (pid: 9)"),
            -11,
        ),
        (
            (
                "Failures:",
                "  exitcode  : 3",
                "Root Cause (first observed failure):",
                "  exitcode  : 1",
            ),
            1,
        ),
        ((*SUMMARY_HEAD, "Root Cause (first observed failure):", "  error_file: <N/A>"), None),
        (("  exitcode  : 78 (pid: 9)",), None),  # no summary: a job's own line proves nothing
        ((), None),
    ],
    ids=[
        "worker 78",
        "a signal",
        "the root cause, not the others",
        "no code",
        "no summary",
        "empty",
    ],
)
def test_a_torchrun_jobs_first_failed_worker_code(tail: tuple[str, ...], code: int | None) -> None:
    assert worker_exit_code(tail) == code


FLAT = [2.0 + 0.01 * (i % 3) for i in range(20)]  # a steady loss around 2
NAN, INF = float("nan"), float("inf")


def _diverged_at(losses: list[float]) -> tuple[int | None, int | None]:
    """Feed the losses at steps 1, 2, ...: (the step it diverged at, its last good step)."""
    from dflashd.supervisor.model.divergence import LossWatch, watched

    watch = LossWatch()
    for step_no, loss in enumerate(losses, start=1):
        watch, _ = watched(watch, loss, step_no)
    return (watch.diverged_at, watch.last_good_step) if watch.diverged else (None, None)


@pytest.mark.parametrize(
    ("losses", "diverged"),
    [
        ([*FLAT, *[NAN] * 3], (21, 20)),  # a NaN that stays: at its first step
        ([*FLAT, NAN], (None, None)),  # one NaN: a loss scaler's skipped step
        ([*FLAT, NAN, 2.0, NAN, NAN, 2.01, INF, 2.0, NAN], (None, None)),  # fp16 skips, back
        ([INF] * 3, (1, None)),  # even from the first loss
        ([*FLAT[:3], *[-INF] * 3], (4, 3)),  # in the warm-up too
        ([*FLAT, *[40.0] * 3, NAN, 40.0], (21, 20)),  # out, then NaN: out five times
        ([-1.0 - 0.05 * i + 0.02 * (i % 4) for i in range(60)], (None, None)),  # an NLL < 0
        ([0.3 - 0.02 * i + 0.01 * (i % 5) for i in range(60)], (None, None)),  # crosses zero
        ([*FLAT, *[40.0] * 5], (21, 20)),  # out and stays out: where it began
        ([*FLAT, *[40.0] * 4], (None, None)),  # not yet: four out is a spike still
        ([*FLAT, *[40.0] * 4, 2.0, *[40.0] * 4], (None, None)),  # back in between: two spikes
        ([*FLAT, *[0.5] * 10], (None, None)),  # a fall is never out
        ([10.0 - 0.4 * i for i in range(20)], (None, None)),  # a steep early descent
        ([*[40.0] * 5, *FLAT], (None, None)),  # high during the warm-up: its range, not out
        ([*FLAT, 2.1, 2.2, 2.3, 2.4, 2.5], (None, None)),  # a drift within a few spreads
    ],
    ids=[
        "nan that stays",
        "one nan",
        "fp16 skipped steps",
        "inf first",
        "-inf in warm-up",
        "out then nan",
        "negative nll",
        "crosses zero",
        "out and stays",
        "four out",
        "two spikes",
        "a fall",
        "steep descent",
        "high warm-up",
        "slow drift",
    ],
)
def test_when_a_loss_diverges(losses: list[float], diverged: tuple[int | None, int | None]) -> None:
    assert _diverged_at(losses) == diverged


@pytest.mark.parametrize(
    ("share", "base", "ratio", "named"),
    [
        (0.60, 0.30, 2.5, True),  # three hogs on the job's CPU
        (0.45, 0.30, 2.5, False),  # a 2.5x slowdown needs the full fifth of a second
        (0.42, 0.30, 1.2, True),  # a mild one: 0.12 s/s of wait explains half its 0.17
        (0.36, 0.30, 1.2, False),  # 0.06 s/s does not
        (0.36, 0.30, 1.05, True),  # 1.05x: the floor of 0.05 s/s
        (0.33, 0.30, 1.05, False),
        (0.90, 0.30, None, True),  # no ratio known: the fifth
        (None, 0.0, 2.0, False),  # no CPU readings: nothing named
    ],
)
def test_when_a_cpu_wait_explains_a_slowdown(
    share: float | None, base: float, ratio: float | None, named: bool
) -> None:
    from dflashd.supervisor.watch.slowness import cpu_wait_explains

    assert cpu_wait_explains(share, base, ratio) is named
