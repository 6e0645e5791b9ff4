"""The daemon's core: the one owner of its state and the one applier of effects.

:class:`DaemonCore` holds the loop's state (:class:`~dflashd.supervisor.lifecycle.LoopState`),
its deadlines (:class:`~dflashd.supervisor.timers.Timers`), the counters kept between runs
(:class:`~dflashd.supervisor.ledger.Ledger`) and the current run.  Every other room reads
them; only this module writes them (``tests/test_house.py`` checks it).  Rooms that decide
return effects (:mod:`effects`): a run's end (:func:`~dflashd.supervisor.decide.ending.conclude`,
pure), a resumed run, a deferred launch, a stop, the GPU release check and samples,
recovery at start-up, the live run's deadlines; :meth:`DaemonCore.apply` carries them out,
in order, in one ``match``.

The death walk reads reap -> conclude -> apply: the run's facts are gathered
(:mod:`reaped`), :meth:`DaemonCore.conclude` decides (pure) and applies.
"""

from __future__ import annotations

import random
import signal
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from dflashd.supervisor.clock import Clock
from dflashd.supervisor.config import Config
from dflashd.supervisor.decide.effects import (
    Account,
    Book,
    Deadline,
    Effect,
    EnterState,
    ExitDaemon,
    KillHolders,
    RecordHistory,
    RestartIn,
    RunLaunched,
    SendAlert,
    SetTimer,
    SettleProcesses,
    StopAsked,
    WriteRecord,
)
from dflashd.supervisor.decide.ending import RunFacts, conclude
from dflashd.supervisor.endedruns import EndedRuns
from dflashd.supervisor.events import Event
from dflashd.supervisor.exitcodes import EXIT_FATAL
from dflashd.supervisor.ledger import Ledger
from dflashd.supervisor.lifecycle import LoopState, State
from dflashd.supervisor.run import Run
from dflashd.supervisor.speak.recorder import Recorder
from dflashd.supervisor.timers import Timers
from dflashd.supervisor.watch.gpuwatch import GpuWatch


class DaemonCore:
    """The daemon's state, written here only, and the one applier of what the rooms decide."""

    def __init__(
        self,
        config: Config,
        clock: Clock,
        reporter: Recorder,
        ended_runs: EndedRuns,
        gpu: GpuWatch,
        publish: Callable[[], object],
    ) -> None:
        self.config, self.clock, self.reporter = config, clock, reporter
        self.ended_runs, self.gpu, self.publish = ended_runs, gpu, publish
        self.loop = LoopState()
        self.timers = Timers()
        self.ledger = Ledger()
        self.run: Run | None = None  # the current (or last) run
        self._rng = random.Random()

    # -- the status throttle, the deadlines --------------------------------------------

    def changed(self) -> None:
        """Something status shows changed: state.json is written within the throttle."""
        self.timers.state_dirty = True

    def published(self, now: float) -> None:
        """The status was just written."""
        self.timers.state_dirty, self.timers.last_state_write = False, now

    def take_due(self, deadline: Deadline, now: float) -> bool:
        """True (and the deadline cleared) when ``deadline`` is set and has come."""
        at = getattr(self.timers, deadline.value)
        if at is None or now < at:
            return False
        setattr(self.timers, deadline.value, None)
        return True

    # -- conclude and apply --------------------------------------------------------------

    def conclude(self, run: Run | None, facts: RunFacts) -> None:
        """Decide the run's end (pure) and carry it out."""
        outcome = conclude(
            facts,
            history=self.ledger.history,
            policy=self.config.restart,
            alerts_on=self.config.alerts.on,
            jitter=self._rng.random(),
            incident=self.ledger.incident,
        )
        self.apply(run, outcome.effects, run_no=facts.run_no, publish=run is not None)

    def apply(
        self,
        run: Run | None,
        effects: Sequence[Effect],
        /,
        *,
        run_no: int | None = None,
        publish: bool = False,
    ) -> None:
        """Carry out ``effects`` in order; ``publish``: then write the status once (a lost
        run concluded at start-up leaves state.json to the first launch, which reads it)."""
        number = run_no if run_no is not None else (run.run_no if run is not None else 0)
        for effect in effects:
            self._apply_one(run, number, effect)
        if publish:
            self.publish()

    def _apply_one(self, run: Run | None, number: int, effect: Effect) -> None:
        timers, ledger = self.timers, self.ledger
        match effect:
            case WriteRecord(event, fields, level, wait, record_run):
                at = number if record_run is None else record_run
                self.reporter.record(at, event, log_level=level, wait_s=wait, **fields)
            case RecordHistory():
                self.reporter.record_history(effect.write)
            case Book():
                ledger.take(effect)
            case Account(cost, died_mono, relaunch):
                ledger.goodput.ended(cost, died_mono, relaunch=relaunch)
            case RunLaunched(started_mono):
                self.run = run  # the current run from now on (launched, or failed to spawn)
                ledger.goodput.launched(started_mono)
            case StopAsked(at):
                self.loop.stop_requested = True
                ledger.goodput.stopping(at)
                timers.restart_at = timers.release_check_at = None
            case SendAlert(kind, reason, fields):
                step = run.progress.step if run is not None else None
                self.reporter.alert(number, step, kind, reason, fields, list(self.gpu.last))
                if run is not None:
                    run.alerted.add(kind)
            case SettleProcesses(kill_now):
                if run is not None:
                    self.ended_runs.settle(run, kill_now=kill_now)
            case KillHolders(pids):
                custody = run.custody if run is not None else None
                if custody is not None:  # each a holder proven to belong to the dead run
                    for pid in pids:
                        custody.signal_pid(pid, signal.SIGKILL)
            case EnterState(state):
                self.loop.enter(state)
            case RestartIn(delay_s):
                timers.restart_at = self.clock.monotonic() + delay_s
            case SetTimer(deadline, at):
                setattr(timers, deadline.value, at)
            case ExitDaemon(code):
                self.loop.end_with(code)
                timers.stop_deadline = None

    def daemon_failed(self, run: Run | None, exc: BaseException) -> None:
        """The last-resort guard: the daemon itself failed; say so, and end as fatal."""
        text = "".join(traceback.format_exception(exc))[-4000:]
        run_no = run.run_no if run is not None else 0
        fields: dict[str, Any] = {"reason": "daemon_error", "error": repr(exc), "traceback": text}
        self.reporter.record(run_no, Event.FATAL, log_level="error", **fields)
        self.loop.state = State.FATAL  # past the table: the daemon itself failed
        self.loop.end_with(EXIT_FATAL)
        self.ledger.take(Book(fatal_reason="daemon_error"))
