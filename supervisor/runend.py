"""Carrying out a run's end: the pure conclusion, then its effects, in order, in one method.

The death walk reads reap -> conclude -> apply: the daemon reaps and gathers the facts
(:mod:`reaped`), :func:`~dflashd.supervisor.ending.conclude` decides everything (pure), and
:meth:`RunEnds.apply` does what it says, effect by effect: records, the runs.sqlite row,
the ledger, alerts, the run's processes, the loop's state, the restart timer, the exit
code.  A resumed run's ``recovered`` alert and a lost run found at start-up take the
same applier.
"""

from __future__ import annotations

import random
import traceback
from collections.abc import Callable
from typing import Any

from dflashd.supervisor.clock import Clock
from dflashd.supervisor.config import Config
from dflashd.supervisor.effects import (
    Account,
    Effect,
    EnterState,
    ExitDaemon,
    RecordHistory,
    RestartIn,
    SendAlert,
    SettleProcesses,
    WriteRecord,
)
from dflashd.supervisor.endedruns import EndedRuns
from dflashd.supervisor.ending import RunFacts, conclude
from dflashd.supervisor.events import Event
from dflashd.supervisor.exitcodes import EXIT_FATAL
from dflashd.supervisor.gpuwatch import GpuWatch
from dflashd.supervisor.ledger import Book, Ledger
from dflashd.supervisor.lifecycle import LoopState, State
from dflashd.supervisor.reporter import Reporter
from dflashd.supervisor.run import Run
from dflashd.supervisor.timers import Timers


class RunEnds:
    """The one applier of what :mod:`ending` decides."""

    def __init__(
        self,
        config: Config,
        clock: Clock,
        loop: LoopState,
        timers: Timers,
        ledger: Ledger,
        reporter: Reporter,
        ended_runs: EndedRuns,
        gpu: GpuWatch,
        publish: Callable[[], object],
    ) -> None:
        self.config, self.clock, self.loop, self.timers = config, clock, loop, timers
        self.ledger, self.reporter, self.ended_runs, self.gpu = ledger, reporter, ended_runs, gpu
        self.publish = publish
        self._rng = random.Random()

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
        self.apply(run, outcome.effects, run_no=facts.run_no)

    def apply(
        self, run: Run | None, effects: tuple[Effect, ...], run_no: int | None = None
    ) -> None:
        """Carry out ``effects`` in order, then publish the status once (with a run: a lost
        run concluded at start-up leaves state.json to the first launch, which reads it)."""
        number = run_no if run_no is not None else (run.run_no if run is not None else 0)
        for effect in effects:
            if isinstance(effect, WriteRecord):
                level, wait = effect.log_level, effect.wait_s
                self.reporter.record(
                    number, effect.event, log_level=level, wait_s=wait, **effect.fields
                )
            elif isinstance(effect, RecordHistory):
                self.reporter.record_history(effect.write)
            elif isinstance(effect, Book):
                self.ledger.take(effect)
            elif isinstance(effect, Account):
                self.ledger.goodput.ended(effect.cost, effect.died_mono, relaunch=effect.relaunch)
            elif isinstance(effect, SendAlert):
                step = run.progress.step if run is not None else None
                gpus = list(self.gpu.last)
                self.reporter.alert(number, step, effect.kind, effect.reason, effect.fields, gpus)
                if run is not None:
                    run.alerted.add(effect.kind)
            elif isinstance(effect, SettleProcesses):
                if run is not None:
                    self.ended_runs.settle(run, kill_now=effect.kill_now)
            elif isinstance(effect, EnterState):
                self.loop.enter(effect.state)
            elif isinstance(effect, RestartIn):
                self.timers.restart_at = self.clock.monotonic() + effect.delay_s
            elif isinstance(effect, ExitDaemon):
                self.loop.end_with(effect.code)
                self.timers.stop_deadline = None
        if run is not None:
            self.publish()

    def daemon_failed(self, run: Run | None, exc: BaseException) -> None:
        """The last-resort guard: the daemon itself failed; say so, and end as fatal."""
        text = "".join(traceback.format_exception(exc))[-4000:]
        run_no = run.run_no if run is not None else 0
        fields: dict[str, Any] = {"reason": "daemon_error", "error": repr(exc), "traceback": text}
        self.reporter.record(run_no, Event.FATAL, log_level="error", **fields)
        self.loop.state = State.FATAL  # past the table: the daemon itself failed
        self.loop.end_with(EXIT_FATAL)
        self.ledger.fatal_reason = "daemon_error"
