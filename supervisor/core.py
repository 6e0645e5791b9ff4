"""The daemon's core: the holder of its state, its one queue of inputs and the one executor.

:class:`DaemonCore` keeps the daemon's state (a :class:`~dflashd.supervisor.model.step.DaemonState`
value) and the current run.  Everything the loop hears is an input on one queue
(:meth:`DaemonCore.step` puts it there); a turn takes one input, hands it to the model's
:func:`~dflashd.supervisor.model.step.step` (the next state replaces the old, never changed)
and carries out the effects, in order, in one ``match`` (:meth:`DaemonCore.execute`): the only
place in the daemon that writes a record, alerts, writes the history row, signals a run's
processes, launches, stops a run or writes the status.  An effect with an answer (a launch, a
look for the dead run's release) puts it on the queue as the next input, and so does an adapter
that hears something while an effect runs: the executor never calls ``step`` from inside a
turn, so no effect runs against a state that moved under it.

The death walk: the loop reaps (:mod:`runs` gathers the facts) -> ``ChildExited``
(:func:`~dflashd.supervisor.model.ending.conclude`, pure) -> its effects -> the restart
deadline -> ``DeadlineDue`` -> a look for the release -> ``ReleaseLooked`` -> the launch ->
``Launched``: each a turn of its own.
"""

from __future__ import annotations

import signal
import traceback
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, assert_never

from dflashd.supervisor.host.clock import Clock
from dflashd.supervisor.model.deadlines import Deadline, Deadlines
from dflashd.supervisor.model.effects import (
    Act,
    DumpStacks,
    EndRunHung,
    KeepPaceBaseline,
    KillHolders,
    KillRun,
    Launch,
    LookForRelease,
    LookForSlowCauses,
    NotifySystemd,
    PrepareStandby,
    Publish,
    RecordHistory,
    RunLaunched,
    SampleStacks,
    SayLaunched,
    SendAlert,
    SettleProcesses,
    SignalLeftovers,
    SignalRun,
    UpdateLedger,
    WatchEmpty,
    WriteRecord,
)
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.exitcodes import EXIT_FATAL
from dflashd.supervisor.model.inputs import DeadlineDue, Input, StatusChanged
from dflashd.supervisor.model.ledger import Ledger
from dflashd.supervisor.model.lifecycle import LoopState, State
from dflashd.supervisor.model.runstate import RunState
from dflashd.supervisor.model.step import DaemonState, step
from dflashd.supervisor.speak.recorder import Recorder
from dflashd.supervisor.watch.run import Run
from dflashd.supervisor.watch.stackdumps import Dumper


class Hands(Protocol):
    """What the executor does through the adapters, each answering with the next input."""

    def launch(self, effect: Launch) -> tuple[Run | None, Input]: ...
    def prepare_standby(self, run: Run | None) -> None: ...

    def keep_pace_baseline(self, run: Run) -> None: ...

    def slow_causes(self, run: Run, look: LookForSlowCauses) -> Input: ...

    def say_launched(self, run: Run | None, error: str | None) -> None: ...

    def look_for_release(self, run: Run | None, look: LookForRelease) -> Input: ...

    def watch_empty(self, run: Run) -> None: ...

    def hang_dump(self, run: Run) -> Input: ...

    def settle(self, run: Run, *, kill_now: bool) -> None: ...

    def notify_systemd(self, text: str) -> None: ...

    def publish(self, *, shown: bool = False, final: bool = False) -> object: ...

    def gpus_seen(self) -> list[dict[str, Any]]: ...

    @property
    def dumps(self) -> Dumper: ...


@dataclass(frozen=True, slots=True)
class Heard:
    """One input on the core's queue, with the run it is about (``run_no``: a run with no
    handles, one a dead daemon lost)."""

    run: Run | None
    heard: Input
    run_no: int | None = None


class DaemonCore:
    """The daemon's state (replaced by the model's ``step`` only) and the one executor."""

    def __init__(self, state: DaemonState, clock: Clock, reporter: Recorder, hands: Hands) -> None:
        self.state, self.clock, self.reporter, self.hands = state, clock, reporter, hands
        self.run: Run | None = None  # the current (or last) run: the shell's handles
        # the last facts of runs that are no longer current (their handles may still be asked)
        self.retired: dict[int, RunState] = {}
        self._queue: deque[Heard] = deque()  # inputs heard during a turn wait for the next
        self._turning = False
        self.turns = 0  # inputs taken so far (tests read it)

    @property
    def loop(self) -> LoopState:
        """The loop's state."""
        return self.state.loop

    @property
    def deadlines(self) -> Deadlines:
        """The deadline table."""
        return self.state.deadlines

    @property
    def ledger(self) -> Ledger:
        """The counters kept between runs."""
        return self.state.ledger

    def facts_of(self, run_no: int) -> RunState:
        """Run ``run_no``'s facts: the model's for the current run, the last ones of an
        earlier run (the shell's :data:`~dflashd.supervisor.watch.run.FactsBook`)."""
        current = self.state.run
        if current is not None and current.run_no == run_no:
            return current
        return self.retired[run_no]

    # -- the one way in ----------------------------------------------------------------------

    def step(self, run: Run | None, heard: Input, *, run_no: int | None = None) -> None:
        """Put ``heard`` (about ``run``) on the queue and take turns until it is empty: one
        input, the model's next state, its effects carried out.  Called while a turn runs (an
        adapter heard something as an effect ran), the input only waits for its own turn."""
        self._queue.append(Heard(run, heard, run_no))
        self._take_turns()

    def _take_turns(self) -> None:
        """Take the queued inputs one turn each, unless a turn already runs (it takes them)."""
        if self._turning:
            return
        self._turning = True
        try:
            while self._queue:
                self._turn(self._queue.popleft())
        finally:
            self._turning = False
            self._queue.clear()  # a turn that raised: the daemon fails, nothing half-taken

    def _turn(self, item: Heard) -> None:
        before = self.state.run
        self.state, effects = step(self.state, item.heard, self.clock.monotonic())
        self.turns += 1
        after = self.state.run
        if before is not None and (after is None or after.run_no != before.run_no):
            self.retired = {before.run_no: before}  # its handles outlive it a while
        self.execute(item.run, effects, run_no=item.run_no)

    def changed(self) -> None:
        """Something status shows changed: state.json is written within the throttle."""
        self.step(self.run, StatusChanged())

    def due(self, deadline: Deadline) -> bool:
        """``deadline`` has come: handed to the model (which clears it); False: not due."""
        if not self.state.deadlines.is_due(deadline, self.clock.monotonic()):
            return False
        self.step(self.run, DeadlineDue(deadline))
        return True

    # -- the executor -----------------------------------------------------------------------

    def execute(
        self, run: Run | None, effects: Sequence[Act], *, run_no: int | None = None
    ) -> None:
        """Carry out ``effects`` in order: the only code in the daemon that acts."""
        number = run_no if run_no is not None else (run.run_no if run is not None else 0)
        for effect in effects:
            self._execute_one(run, number, effect)
        self._take_turns()  # effects carried out outside a turn: their answers' turns now

    def _execute_one(self, run: Run | None, number: int, effect: Act) -> None:
        hands = self.hands
        match effect:
            case WriteRecord(event, fields, level, wait, record_run):
                at = number if record_run is None else record_run
                self.reporter.record(at, event, log_level=level, wait_s=wait, **fields)
            case RecordHistory(run_no, ended_at, row):
                self.reporter.record_history(lambda db: db.ended(run_no, ended_at=ended_at, **row))
            case SendAlert(kind, reason, fields):
                step = run.facts.progress.step if run is not None else None
                self.reporter.alert(number, step, kind, reason, fields, hands.gpus_seen())
            case SettleProcesses(kill_now):
                if run is not None:
                    hands.settle(run, kill_now=kill_now)
            case SignalLeftovers(signum):
                if run is not None and run.custody is not None:
                    run.custody.signal_all(signal.Signals(signum))
            case WatchEmpty():
                if run is not None:
                    hands.watch_empty(run)
            case KillHolders(pids):
                custody = run.custody if run is not None else None
                if custody is not None:  # each a holder proven to belong to the dead run
                    for pid in pids:
                        custody.signal_pid(pid, signal.SIGKILL)
            case RunLaunched():
                self.run = run  # the current run from now on (launched, or failed to spawn)
            case Launch():
                launched, answer = hands.launch(effect)
                self._queue.append(Heard(launched, answer))  # the next turn's input
            case SayLaunched(error):
                hands.say_launched(run, error)
            case LookForRelease():
                answer = hands.look_for_release(run, effect)
                self._queue.append(Heard(run, answer))
            case PrepareStandby():
                hands.prepare_standby(run)
            case KeepPaceBaseline():
                if run is not None:
                    hands.keep_pace_baseline(run)
            case LookForSlowCauses():
                if run is not None:
                    self._queue.append(Heard(run, hands.slow_causes(run, effect)))
            case SignalRun(to, signum):
                custody = run.custody if run is not None else None
                if custody is not None and to == "group":
                    custody.signal_group(signal.Signals(signum))
                elif custody is not None:
                    custody.signal_root(signal.Signals(signum))
            case KillRun():
                if run is not None and run.custody is not None:
                    run.custody.kill_all()
            case DumpStacks(trigger, dump_id, native):
                if run is not None and hands.dumps.available:
                    hands.dumps.start(run, trigger, native=native, dump_id=dump_id or None)
            case SampleStacks(share):
                if run is not None:
                    hands.dumps.sample(run, share)
            case EndRunHung():  # the proving sample's files; the kill is the answer's turn
                if run is not None:
                    self._queue.append(Heard(run, hands.hang_dump(run)))
            case Publish(shown, final):
                hands.publish(shown=shown, final=final)
            case NotifySystemd(text):
                hands.notify_systemd(text)
            case _:  # every act has its arm (mypy proves it); a patch never comes: step folds it
                assert_never(effect)

    def daemon_failed(self, run: Run | None, exc: BaseException) -> None:
        """The last-resort guard: the daemon itself failed; say so, and end as fatal."""
        text = "".join(traceback.format_exception(exc))[-4000:]
        run_no = run.run_no if run is not None else 0
        fields: dict[str, Any] = {"reason": "daemon_error", "error": repr(exc), "traceback": text}
        self.reporter.record(run_no, Event.FATAL, log_level="error", **fields)
        loop = replace(self.state.loop, state=State.FATAL)  # past the table: the daemon failed
        ledger = self.state.ledger.took(UpdateLedger(fatal_reason="daemon_error"))
        self.state = replace(self.state, loop=loop.ended_with(EXIT_FATAL), ledger=ledger)
