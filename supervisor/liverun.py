"""Ending a live run: the one room that decides when dflashd ends a run that has not died.

Three ways, each with its deadline kept here: ``dflashd stop`` (SIGTERM to the job's group,
SIGKILL past ``stop_timeout_s``), a stall (the progress deadline passed and the evidence
says stuck), and no GPU memory past its grace (the GPU watch's verdict).  Ending asks for a
stack dump first (SIGABRT: ``PYTHONFAULTHANDLER=1`` prints every thread), then kills the
whole run after ``DUMP_GRACE_S``.  The run's death then takes the usual walk (reap ->
conclude -> apply), with ``run.ended_by`` saying who ended it.
"""

from __future__ import annotations

import signal
from typing import Final

from dflashd.supervisor.clock import Clock
from dflashd.supervisor.events import Event
from dflashd.supervisor.observe import RunObserver
from dflashd.supervisor.progress import Limits
from dflashd.supervisor.reporter import Reporter
from dflashd.supervisor.run import Run
from dflashd.supervisor.timers import Timers
from dflashd.supervisor.verdicts import EndedBy

DUMP_GRACE_S: Final = 3.0  # between SIGABRT (stack dump) and SIGKILL


class LiveRunControl:
    """Stop, end and kill the live run, each at its deadline."""

    def __init__(
        self,
        clock: Clock,
        reporter: Reporter,
        observer: RunObserver,
        limits: Limits,
        timers: Timers,
    ) -> None:
        self.clock, self.reporter, self.observer = clock, reporter, observer
        self.limits, self.timers = limits, timers

    def stop(self, run: Run, timeout_s: float) -> None:
        """``dflashd stop``: SIGTERM to the run's group (and SIGCONT, should it be stopped)."""
        custody = run.custody
        if custody is None:
            return
        if not run.ended_by_us:
            run.ended_by = EndedBy.STOP
        self.reporter.record(run.run_no, Event.STOPPING, signal="SIGTERM", timeout_s=timeout_s)
        custody.signal_group(signal.SIGTERM)
        custody.signal_group(signal.SIGCONT)
        self.timers.stop_deadline = self.clock.monotonic() + timeout_s

    def end(self, run: Run, why: EndedBy) -> None:
        """dflashd ends the run (stall, no GPU memory): a stack dump, then the kill."""
        custody = run.custody
        if custody is None or not run.alive or run.ended_by_us:
            return
        run.ended_by = why
        self.reporter.record(
            run.run_no,
            Event.ENDING_RUN,
            log_level="warning",
            why=why.value,
            signal="SIGABRT",
            then="SIGKILL",
        )
        # PYTHONFAULTHANDLER=1 makes a Python child print every thread's stack on SIGABRT;
        # SIGCONT after it, so a stopped (SIGSTOPped) child wakes up to take it.
        custody.signal_root(signal.SIGABRT)
        custody.signal_group(signal.SIGCONT)
        run.kill_at_mono = self.clock.monotonic() + DUMP_GRACE_S

    def check(self, run: Run | None, now: float) -> None:
        """The deadlines: the kill after a dump, a stall, a stop past its timeout."""
        live = run is not None and run.alive and run.pid is not None
        if live and run is not None:
            if run.kill_at_mono is not None and now >= run.kill_at_mono:
                run.kill_at_mono = None
                if run.custody is not None:
                    run.custody.kill_all()
            stall = None if run.ended_by_us else run.progress.stall_deadline(self.limits)
            if stall is not None and now >= stall and (why := self.observer.stall_reason(run, now)):
                self.end(run, why)
        if self.timers.stop_deadline is not None and now >= self.timers.stop_deadline:
            self.timers.stop_deadline = None
            if live and run is not None:
                self.reporter.record(run.run_no, Event.STOP_TIMEOUT, signal="SIGKILL")
                if run.custody is not None:
                    run.custody.kill_all()
