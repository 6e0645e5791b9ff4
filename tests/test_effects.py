"""The loop's decisions beyond a run's end, as tables (issue 35): start-up's restore, a
deferred launch, a stop, the GPU release check, each a pure value of effects; and the one
applier (:class:`~dflashd.supervisor.core.DaemonCore`) carrying each effect type out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dflashd.supervisor.core import DaemonCore
from dflashd.supervisor.host.clock import ManualClock
from dflashd.supervisor.host.recovery import lost_run
from dflashd.supervisor.model.carried import restore
from dflashd.supervisor.model.deadlines import Deadline
from dflashd.supervisor.model.effects import (
    EnterState,
    Launch,
    LookForRelease,
    Publish,
    SetTimer,
    StopAsked,
    UpdateLedger,
    WriteRecord,
)
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.inputs import (
    CarriedOver,
    Input,
    Launched,
    LaunchPutOff,
    ReleaseLooked,
    Started,
    StatusWritten,
    StopRequested,
)
from dflashd.supervisor.model.leftovers import LEFTOVER_GRACE_S, Leftovers
from dflashd.supervisor.model.lifecycle import State
from dflashd.supervisor.model.progress import Progress
from dflashd.supervisor.model.runstate import RunState
from dflashd.supervisor.model.step import (
    LAUNCH_RETRY_S,
    DaemonState,
    deferred_launch,
    fold,
    stop_effects,
)
from dflashd.supervisor.watch.run import Run

NOW_WALL = 1_800_000_000.0


def _restored(previous: dict[str, Any], saved: tuple[float, Any, bool] | None, **kw: Any) -> Any:
    kw["leftovers"] = tuple(kw.get("leftovers", ()))
    lost = lost_run(previous, NOW_WALL)  # what the shell reads of state.json
    return restore(CarriedOver(previous, saved, now_wall=NOW_WALL, lost=lost, **kw), 50.0)


def test_a_first_start_carries_nothing_and_writes_nothing() -> None:
    restored = _restored({}, None)
    book = restored.effects[0]
    assert isinstance(book, UpdateLedger) and book.restarts_by_verdict == {}
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
    assert isinstance(book, UpdateLedger) and book.restarts_by_verdict == {"crashed": 2}
    assert isinstance(carried, WriteRecord) and carried.event is Event.GOODPUT_CARRIED
    assert carried.run_no == 0 and carried.fields[bucket] == pytest.approx(600.0)
    assert book.goodput is not None and getattr(book.goodput.absent, bucket) == 600.0


def test_a_fatal_end_waits_for_recovery_and_leftovers_and_a_torn_tail_are_said_in_order() -> None:
    leftover = WriteRecord(Event.RECOVERED_ORPHAN, {"pids": [7]}, log_level="warning", run_no=3)
    restored = _restored({"state": "fatal"}, None, leftovers=[leftover], torn_bytes=12, last_run=3)
    book, said, torn = restored.effects
    assert isinstance(book, UpdateLedger) and book.recovering_from == "fatal"
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
    assert book == UpdateLedger(clear_cache_next=clear)
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


class Written:
    """A recorder that keeps what it was asked to write."""

    def __init__(self) -> None:
        self.records: list[tuple[int, Event, dict[str, Any]]] = []

    def record(self, run_no: int, event: Event, /, **fields: Any) -> int:
        for key in ("log_level", "wait_s"):
            fields.pop(key, None)
        self.records.append((run_no, event, fields))
        return len(self.records)


def _run(core: DaemonCore, run_no: int, clock: ManualClock) -> tuple[Run, RunState]:
    """A run's handles (its facts kept by ``core``) and its facts at launch."""
    now = clock.monotonic()
    facts = RunState(run_no, ("job",), now, clock.time(), Progress(started_mono=now))
    return Run(run_no, core.facts_of), facts


class NoDumps:
    """Stack dumps that are not there (no py-spy)."""

    available = False


class Hands:
    """The executor's hands, scripted: what it was asked to do, in order."""

    def __init__(self) -> None:
        self.done: list[str] = []
        self.dumps = NoDumps()

    def launch(self, effect: Launch) -> tuple[Run | None, Input]:
        self.done.append("launch")
        return None, LaunchPutOff(1, "EMFILE", 0, effect.clear_cache)

    def say_launched(self, run: Run | None, error: str | None) -> None:
        self.done.append(f"say_launched {error}")

    def look_for_release(self, run: Run | None, look: LookForRelease) -> Input:
        self.done.append("look")
        return ReleaseLooked(Leftovers(1, ((99, "python train.py"),), "pidfd"))

    def watch_empty(self, run: Run) -> None:
        self.done.append("watch_empty")

    def settle(self, run: Run, *, kill_now: bool) -> None:
        self.done.append(f"settle {kill_now}")

    def notify_systemd(self, text: str) -> None:
        self.done.append(text)

    def publish(self, *, shown: bool = False, final: bool = False) -> object:
        self.done.append("publish")
        return None

    def gpus_seen(self) -> list[dict[str, Any]]:
        return []


def _core(tmp_path: Path) -> tuple[DaemonCore, Written, ManualClock, Hands]:
    clock, written, hands = ManualClock(), Written(), Hands()
    core = DaemonCore(DaemonState(), clock, written, hands)  # type: ignore[arg-type]
    return core, written, clock, hands


def test_the_core_executes_each_effect_and_the_model_alone_changes_the_state(
    tmp_path: Path,
) -> None:
    core, written, clock, hands = _core(tmp_path)
    run, facts = _run(core, 3, clock)
    before, t = core.state, clock.monotonic()
    core.step(run, Launched(facts))  # the run is current: its facts are the state's
    assert hands.done == ["publish", "say_launched None"] and core.facts_of(3) is facts
    hands.done.clear()
    said = (
        EnterState(State.RUNNING),
        SetTimer(Deadline.STOP, t + 40.0),
        SetTimer(Deadline.RELEASE_CHECK, t + 41.0),
        UpdateLedger(agent_restarts=1, agent_worker_failures=2),
        WriteRecord(Event.STOPPING, {"signal": "SIGTERM"}),
        WriteRecord(Event.GPU, {"gpus": []}, run_no=0),
        Publish(),
    )
    core.state, acts = fold(core.state, said, t)  # what the model returns for such a turn
    core.execute(run, acts)
    assert before == DaemonState()  # a value: the old state is untouched, the new one kept
    assert core.run is run and core.loop.state is State.RUNNING
    assert (core.deadlines.stop_at, core.deadlines.release_check_at) == (t + 40.0, t + 41.0)
    assert (core.ledger.agent_restarts, core.ledger.agent_worker_failures) == (1, 2)
    assert [(n, e) for n, e, _ in written.records] == [(3, Event.STOPPING), (0, Event.GPU)]
    assert hands.done == ["publish"]
    # counters add up; no publish unless asked
    core.state, acts = fold(core.state, (UpdateLedger(agent_restarts=1),), t)
    core.execute(run, acts)
    assert core.ledger.agent_restarts == 2 and hands.done == ["publish"]
    clock.advance(5.0)
    core.step(run, StopRequested(7.0, alive=True))
    assert core.loop.stop_requested and core.loop.state.value == "stopping"
    assert core.deadlines.release_check_at is None and core.ledger.goodput.stop_at is not None
    assert hands.done[1:] == ["STOPPING=1", "publish"]  # the signals: run's custody (none here)
    stopping = [n for n, e, _ in written.records if e is Event.STOPPING]
    assert (
        stopping == [3, 3] and core.deadlines.stop_at
    )  # the one applied above, the stop's == t + 5.0 + 7.0  # the grace is the stop's
    assert core.due(Deadline.STOP) is False  # 5 s in: the grace runs 7 s
    clock.advance(7.0)
    assert core.due(Deadline.STOP) is True and core.deadlines.stop_at is None
    assert core.state.run is not None and core.state.run.dump_before_kill == "3-1"  # its stacks


def test_the_core_counts_the_launch_gap_and_the_end_into_goodput(tmp_path: Path) -> None:
    core, _written, clock, _hands = _core(tmp_path)
    core.step(None, CarriedOver({}, None))  # a first start: the gap before the launch counts
    clock.advance(2.0)
    run, facts = _run(core, 1, clock)
    core.step(run, Launched(facts))
    assert core.ledger.goodput.closed.downtime_s == pytest.approx(2.0)
    assert core.ledger.goodput.gap_since is None  # the run is the open stretch now


def test_a_launch_put_off_keeps_its_number_for_the_retry(tmp_path: Path) -> None:
    core, written, clock, hands = _core(tmp_path)
    core.step(None, Started())
    assert hands.done == ["launch"]  # put off: nobody is told of a launch yet
    assert core.state.deferred_run_no == 1 and core.loop.state is State.STARTING
    assert [e for _, e, _ in written.records] == [Event.LAUNCH_DEFERRED]
    assert core.deadlines.restart_at == pytest.approx(clock.monotonic() + LAUNCH_RETRY_S)
    clock.advance(LAUNCH_RETRY_S)
    assert core.due(Deadline.RESTART) is True
    assert hands.done[1:] == ["look"]  # the host is asked first: is the dead run gone?
    assert core.deadlines.release_check_at == pytest.approx(clock.monotonic() + LEFTOVER_GRACE_S)


def test_a_slow_incident_open_when_the_daemon_died_is_closed_once_with_its_lost_run() -> None:
    """Issue 50 (5): the daemon killed in the middle of a slow incident: the next one closes it
    once, for the lost run (no `recovered` alert: nothing came back), and a start with no open
    incident writes none."""
    child = {"pid": 999_999, "create_time": 1.0, "boot_id": "b"}
    previous = {"state": "running", "run": 4, "child": child, "step": 120}
    slow = {"ratio": 2.5, "step": 100, "since": NOW_WALL - 60, "causes": ["cause unknown"]}
    restored = _restored({**previous, "slow": slow}, None)
    closed = [
        e for e in restored.effects if isinstance(e, WriteRecord) and e.event is Event.SLOW_OVER
    ]
    assert len(closed) == 1 and closed[0].run_no == 4 and closed[0].fields["ratio"] == 2.5
    assert restored.lost is not None and restored.lost.run_no == 4
    plain = _restored(previous, None)
    assert not [
        e for e in plain.effects if isinstance(e, WriteRecord) and e.event is Event.SLOW_OVER
    ]


class Reentering(Hands):
    """Hands whose publish hears something at once (as the daemon's publish does: the status
    written) and whose launch answers at once."""

    def __init__(self, core: list[DaemonCore], facts: list[RunState], run: list[Run]) -> None:
        super().__init__()
        self.core, self.facts, self.run = core, facts, run

    def launch(self, effect: Launch) -> tuple[Run | None, Input]:
        self.done.append(f"launch turn {self.core[0].turns}")
        return self.run[0], Launched(self.facts[0])

    def publish(self, *, shown: bool = False, final: bool = False) -> object:
        core = self.core[0]
        self.done.append(f"publish turn {core.turns}")
        core.step(None, StatusWritten())  # heard during a turn: waits for its own
        self.done.append(f"published, still turn {core.turns}")
        return None


def test_the_executor_never_enters_step_again_an_answer_is_the_next_turn(tmp_path: Path) -> None:
    """Issue 52 (1): one queue, one turn: a launch's answer and what an adapter hears while an
    effect runs are the next inputs, never a step inside a step."""
    clock, written = ManualClock(), Written()
    cores: list[DaemonCore] = []
    facts_list: list[RunState] = []
    runs: list[Run] = []
    hands = Reentering(cores, facts_list, runs)
    core = DaemonCore(DaemonState(), clock, written, hands)  # type: ignore[arg-type]
    cores.append(core)
    run, facts = _run(core, 1, clock)
    runs.append(run)
    facts_list.append(facts)
    core.step(None, Started())
    assert hands.done == [
        "launch turn 1",  # Started: the launch is this turn's effect
        "publish turn 2",  # Launched: the next turn, its publish
        "published, still turn 2",  # StatusWritten heard inside the turn did not run in it
        "say_launched None",  # ...and the launch is told after its records, in the same turn
    ]
    assert core.turns == 3  # Started, Launched, StatusWritten: one after another
    assert core.run is run and core.loop.state is State.RUNNING
    assert core.deadlines.last_state_write == clock.monotonic()  # StatusWritten was taken


def test_an_answer_to_an_effect_carried_out_outside_a_turn_is_taken_at_once(
    tmp_path: Path,
) -> None:
    """The daemon carries out a few effects itself (the status written on its timer, a
    client's status, the close): an answer one of them brings is still a turn of its own."""
    core, written, _clock, hands = _core(tmp_path)
    core.execute(None, (Launch(clear_cache=False, run_no=None, best_before=None, downtime_s=None),))
    assert hands.done == ["launch"] and core.turns == 1  # its answer (put off) was taken
    assert core.state.deferred_run_no == 1
    assert [e for _, e, _ in written.records] == [Event.LAUNCH_DEFERRED]
