"""The loop's decisions beyond a run's end, as tables (issue 35): start-up's restore, a
deferred launch, a stop, the GPU release check, each a pure value of effects; and the one
applier (:class:`~dflashd.supervisor.core.DaemonCore`) carrying each effect type out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dflashd.supervisor.clock import ManualClock
from dflashd.supervisor.config import parse_config
from dflashd.supervisor.core import DaemonCore
from dflashd.supervisor.decide.effects import (
    Book,
    Deadline,
    EnterState,
    KillHolders,
    RunLaunched,
    SetTimer,
    StopAsked,
    WriteRecord,
)
from dflashd.supervisor.endedruns import EndedRuns
from dflashd.supervisor.events import Event
from dflashd.supervisor.host.recovery import restore
from dflashd.supervisor.lifecycle import State
from dflashd.supervisor.run import Run
from dflashd.supervisor.runs import LAUNCH_RETRY_S, deferred_launch, stop_effects
from dflashd.supervisor.watch.gpuwatch import GpuSettings, GpuWatch, ReleaseCheck
from dflashd.supervisor.watch.progress import Progress

NOW_WALL = 1_800_000_000.0


def _restored(previous: dict[str, Any], saved: tuple[float, Any, bool] | None, **kw: Any) -> Any:
    args: dict[str, Any] = {"leftovers": [], "torn_bytes": 0, "last_run": 0, **kw}
    return restore(previous, saved_goodput=saved, now_wall=NOW_WALL, now_mono=50.0, **args)


def test_a_first_start_carries_nothing_and_writes_nothing() -> None:
    restored = _restored({}, None)
    book = restored.effects[0]
    assert isinstance(book, Book) and book.restarts_by_verdict == {}
    assert book.recovering_from is None and book.goodput is not None
    assert book.goodput.first_start == NOW_WALL
    assert restored.effects[1:] == () and restored.lost is None


@pytest.mark.parametrize(("daemon_ended", "bucket"), [(True, "stopped_s"), (False, "downtime_s")])
def test_the_time_no_daemon_was_here_is_said_once(daemon_ended: bool, bucket: str) -> None:
    first = NOW_WALL - 1000.0
    saved = (first, {"productive_s": 400.0}, daemon_ended)  # settled until first + 400
    previous = {"state": "stopped", "restarts_by_verdict": {"crashed": 2}}
    restored = _restored(previous, saved)
    book, carried = restored.effects
    assert isinstance(book, Book) and book.restarts_by_verdict == {"crashed": 2}
    assert isinstance(carried, WriteRecord) and carried.event is Event.GOODPUT_CARRIED
    assert carried.run_no == 0 and carried.fields[bucket] == pytest.approx(600.0)
    assert book.goodput is not None and getattr(book.goodput.absent, bucket) == 600.0


def test_a_fatal_end_waits_for_recovery_and_leftovers_and_a_torn_tail_are_said_in_order() -> None:
    leftover = WriteRecord(Event.RECOVERED_ORPHAN, {"pids": [7]}, log_level="warning", run_no=3)
    restored = _restored({"state": "fatal"}, None, leftovers=[leftover], torn_bytes=12, last_run=3)
    book, said, torn = restored.effects
    assert isinstance(book, Book) and book.recovering_from == "fatal"
    assert said is leftover
    assert torn == WriteRecord(Event.LOG_TORN_TAIL, {"bytes": 12}, run_no=3)


def test_a_run_the_dead_daemon_never_saw_end_is_lost() -> None:
    previous = {
        "state": "running",
        "run": 5,
        "child": {"pid": 4242, "create_time": 1.0, "boot_id": "b"},
        "step": 17,
    }
    lost = _restored(previous, None).lost
    assert lost is not None and (lost.run_no, lost.step) == (5, 17)
    ended = {**previous, "last_exit": {"run": 5}}
    assert _restored(ended, None).lost is None  # its exit was recorded: nothing lost


@pytest.mark.parametrize("clear", [True, False])
def test_a_deferred_launch_says_so_keeps_the_cache_clearing_and_retries(clear: bool) -> None:
    effects = deferred_launch(4, "EMFILE", freed=8, clear_cache=clear, now=100.0)
    record, book, timer = effects
    assert isinstance(record, WriteRecord) and record.event is Event.LAUNCH_DEFERRED
    assert record.run_no == 4 and record.fields == {
        "error": "EMFILE",
        "retry_in_s": LAUNCH_RETRY_S,
        "reserve_freed": 8,
    }
    assert book == Book(clear_cache_next=clear)
    assert timer == SetTimer(Deadline.RESTART, 100.0 + LAUNCH_RETRY_S)


@pytest.mark.parametrize(
    ("alive", "states"),
    [(True, [State.STOPPING]), (False, [State.STOPPING, State.STOPPED])],
)
def test_a_stop_asks_no_relaunch_and_ends_at_once_when_nothing_runs(
    alive: bool, states: list[State]
) -> None:
    effects = stop_effects(alive=alive, now=9.0)
    assert effects[0] == StopAsked(9.0)
    assert [e.state for e in effects[1:] if isinstance(e, EnterState)] == states


@pytest.mark.parametrize(
    ("check", "kinds"),
    [
        (ReleaseCheck(True), []),
        (ReleaseCheck(False, retry_at=3.0), ["SetTimer"]),
        (ReleaseCheck(False, kill=[11, 12], retry_at=3.0), ["KillHolders", "SetTimer"]),
        (
            ReleaseCheck(True, records=[WriteRecord(Event.GPU_MEMORY_RELEASED, {"waited_s": 1})]),
            ["WriteRecord"],
        ),
    ],
)
def test_the_release_check_is_effects(check: ReleaseCheck, kinds: list[str]) -> None:
    assert [type(e).__name__ for e in check.effects] == kinds
    for effect in check.effects:
        if isinstance(effect, SetTimer):
            assert effect == SetTimer(Deadline.RELEASE_CHECK, 3.0)
        if isinstance(effect, KillHolders):
            assert effect.pids == (11, 12)


class Written:
    """A recorder that keeps what it was asked to write."""

    def __init__(self) -> None:
        self.records: list[tuple[int, Event, dict[str, Any]]] = []

    def record(self, run_no: int, event: Event, /, **fields: Any) -> int:
        for key in ("log_level", "wait_s"):
            fields.pop(key, None)
        self.records.append((run_no, event, fields))
        return len(self.records)


def _run(run_no: int, clock: ManualClock) -> Run:
    now = clock.monotonic()
    return Run(run_no, ("job",), now, clock.time(), Progress(started_mono=now))


def _core(tmp_path: Path) -> tuple[DaemonCore, Written, ManualClock, list[int]]:
    clock, written, published = ManualClock(), Written(), [0]
    config = parse_config({"gpus": "none"})
    ended = EndedRuns(None, written)  # type: ignore[arg-type]  # settles nothing here
    gpu = GpuWatch(GpuSettings.from_config(config))
    publish = lambda: published.__setitem__(0, published[0] + 1)  # noqa: E731
    core = DaemonCore(config, clock, written, ended, gpu, publish)  # type: ignore[arg-type]
    return core, written, clock, published


def test_the_core_applies_each_effect_and_alone_writes_the_state(tmp_path: Path) -> None:
    core, written, clock, published = _core(tmp_path)
    run = _run(3, clock)
    core.apply(
        run,
        (
            RunLaunched(run.started_mono),
            EnterState(State.RUNNING),
            SetTimer(Deadline.STOP, 40.0),
            SetTimer(Deadline.RELEASE_CHECK, 41.0),
            Book(agent_restarts=1, agent_worker_failures=2),
            WriteRecord(Event.STOPPING, {"signal": "SIGTERM"}),
            WriteRecord(Event.GPU, {"gpus": []}, run_no=0),
        ),
        publish=True,
    )
    assert core.run is run and core.loop.state is State.RUNNING
    assert (core.timers.stop_deadline, core.timers.release_check_at) == (40.0, 41.0)
    assert (core.ledger.agent_restarts, core.ledger.agent_worker_failures) == (1, 2)
    assert [(n, e) for n, e, _ in written.records] == [(3, Event.STOPPING), (0, Event.GPU)]
    assert published == [1]
    core.apply(run, (Book(agent_restarts=1),))  # counters add up; no publish unless asked
    assert core.ledger.agent_restarts == 2 and published == [1]
    clock.advance(5.0)
    core.apply(run, (StopAsked(clock.monotonic()), EnterState(State.STOPPING)))
    assert core.loop.stop_requested and core.loop.state.value == "stopping"
    assert core.timers.release_check_at is None and core.ledger.goodput.stop_at is not None
    assert core.take_due(Deadline.STOP, 39.0) is False
    assert core.take_due(Deadline.STOP, 40.0) is True and core.timers.stop_deadline is None


def test_the_core_counts_the_launch_gap_and_the_end_into_goodput(tmp_path: Path) -> None:
    core, _written, clock, _published = _core(tmp_path)
    core.ledger.goodput.gap_since = clock.monotonic()  # what restore starts with
    clock.advance(2.0)
    run = _run(1, clock)
    core.apply(run, (RunLaunched(run.started_mono),))
    assert core.ledger.goodput.closed.downtime_s == pytest.approx(2.0)
    assert core.ledger.goodput.gap_since is None  # the run is the open stretch now
