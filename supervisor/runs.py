"""One run after another, as the loop sees it: launch, stop, reap, relaunch once released.

The death walk starts here and reads reap -> conclude -> apply: :meth:`Runs.reap` takes the
child's wait status, :meth:`Runs._child_died` counts its last words and gathers the facts
(:mod:`reaped`), and :class:`~dflashd.supervisor.runend.RunEnds` concludes (pure,
:mod:`ending`) and applies.  A relaunch waits until nothing of the dead run is left
(:mod:`endedruns`) and its GPU memory is released (:mod:`gpuwatch`).
"""

from __future__ import annotations

import math
import os
import signal
from collections.abc import Callable
from typing import Any, Final

from dflashd.supervisor.clock import Clock
from dflashd.supervisor.config import MAX_SECONDS, Config
from dflashd.supervisor.endedruns import EndedRuns
from dflashd.supervisor.events import Event
from dflashd.supervisor.fdreserve import FdReserve
from dflashd.supervisor.gpuwatch import GpuWatch
from dflashd.supervisor.launcher import LaunchDeferred, Launcher
from dflashd.supervisor.ledger import Ledger
from dflashd.supervisor.lifecycle import LoopState, State
from dflashd.supervisor.liverun import LiveRunControl
from dflashd.supervisor.notify import SystemdNotifier
from dflashd.supervisor.observe import RunObserver
from dflashd.supervisor.processops import ProcessOps
from dflashd.supervisor.reaped import mark_reaped, reaped_facts, spawn_failed_facts
from dflashd.supervisor.reporter import Reporter
from dflashd.supervisor.run import Run
from dflashd.supervisor.runend import RunEnds
from dflashd.supervisor.timers import Timers

LAUNCH_RETRY_S: Final = 1.0  # a launch deferred for want of descriptors is tried again after this
# The child's last words are already in the pipes: framing them is quick, unless the log's
# disk pushes back; the sink drops after 2 s of a stalled write, so this bound is never hit
# by a healthy disk, and the exit record still follows every byte caught up.
CATCH_UP_S: Final = 5.0

FirstLaunch = Callable[[dict[str, Any]], None]


class Runs:
    """The current run and what the loop does to it between launches."""

    def __init__(
        self,
        config: Config,
        clock: Clock,
        loop: LoopState,
        timers: Timers,
        ledger: Ledger,
        ops: ProcessOps,
        reporter: Reporter,
        gpu: GpuWatch,
        observer: RunObserver,
        launcher: Launcher,
        live: LiveRunControl,
        ended_runs: EndedRuns,
        ends: RunEnds,
        systemd: SystemdNotifier,
    ) -> None:
        self.config, self.clock, self.loop, self.timers = config, clock, loop, timers
        self.ledger, self.ops, self.reporter, self.gpu = ledger, ops, reporter, gpu
        self.observer, self.launcher, self.live = observer, launcher, live
        self.ended_runs, self.ends, self.systemd = ended_runs, ends, systemd
        self.run: Run | None = None
        self.fd_reserve = FdReserve()
        self._deferred_run_no: int | None = None
        # Set by the daemon: drain the inbox (the last steps before a verdict), publish the
        # status, and the first launch's callback (``start`` waits for it).
        self.process_inbox: Callable[[], None] = lambda: None
        self.publish: Callable[[], str] = lambda: ""
        self.on_first_launch: FirstLaunch | None = None

    # -- launch ---------------------------------------------------------------------------

    def relaunch_when_released(self, now: float) -> None:
        """Launch once nothing of the dead run lives and its GPU memory is released."""
        if (wait := self.ended_runs.end_leftovers(self.run, now)) is not None:
            self.timers.release_check_at = wait  # nothing of the dead run lives into the next
            return
        check = self.gpu.release_check(self.run, self.ops, now)
        for event, fields in check.records:
            self.reporter.record(self.run.run_no if self.run else 0, event, **fields)
        custody = self.run.custody if self.run is not None else None
        for pid in check.kill:
            if custody is not None:  # a holder proven to belong to the dead run
                custody.signal_pid(pid, signal.SIGKILL)
        if check.ready:
            self.launch()
        else:
            self.timers.release_check_at = check.retry_at

    def emptied(self, run_no: int, now: float) -> None:
        """The dead run's last process is gone (a custody watcher said so): relaunch now."""
        run = self.run
        waiting = self.timers.release_check_at is not None
        if waiting and run is not None and run.run_no == run_no and not run.alive:
            self.timers.release_check_at = None
            self.relaunch_when_released(now)

    def launch(self) -> None:
        """The next run: ``spawn`` on disk, the fork, ``launched`` (or a deferral, or a verdict)."""
        self.loop.enter(State.STARTING)
        clear, self.ledger.clear_cache_next = self.ledger.clear_cache_next, False
        run_no, self._deferred_run_no = self._deferred_run_no, None
        goodput, now = self.ledger.goodput, self.clock.monotonic()
        try:
            run, error = self.launcher.launch(
                self.run,
                clear_cache=clear,
                run_no=run_no,
                best_before=goodput.best_before(self.ledger.history.best_step),
                downtime_s=goodput.downtime_s(now),
            )
        except LaunchDeferred as deferred:
            freed = self.fd_reserve.release()  # room for the records and the next attempt
            self.reporter.record(
                deferred.run_no,
                Event.LAUNCH_DEFERRED,
                log_level="warning",
                error=deferred.error,
                retry_in_s=LAUNCH_RETRY_S,
                reserve_freed=freed,
            )
            self._deferred_run_no = deferred.run_no
            self.ledger.clear_cache_next = clear
            self.timers.restart_at = self.clock.monotonic() + LAUNCH_RETRY_S
            return
        self.fd_reserve.take()
        self.run = run
        goodput.launched(run.started_mono)
        if error is not None:
            stopping, stop_at = self.loop.stop_requested, goodput.stop_at
            ended_at = self.clock.time()
            facts = spawn_failed_facts(
                run, error, ended_at=ended_at, stopping=stopping, stop_at=stop_at
            )
            self.ends.conclude(run, facts)
            self._first_launch({"ok": False, "run": run.run_no, "error": f"spawn failed: {error}"})
            return
        self.loop.enter(State.RUNNING)
        summary = self.publish()
        self._first_launch({"ok": True, "run": run.run_no, "pid": run.pid})
        if self.systemd.enabled:  # READY means the launch is in the log: on disk first
            self.reporter.sink.flush(1.0)
            self.systemd.notify(f"READY=1\nSTATUS={summary}")

    def _first_launch(self, info: dict[str, Any]) -> None:
        callback, self.on_first_launch = self.on_first_launch, None
        if callback is not None:
            callback({**info, "log": str(self.reporter.log_path), "daemon_pid": os.getpid()})

    # -- stop and death -------------------------------------------------------------------

    def request_stop(self, timeout_s: float) -> None:
        """Stop: SIGTERM to the child's group, SIGKILL after ``timeout_s``, then exit."""
        if self.loop.stop_requested or self.loop.done:
            return
        if not math.isfinite(timeout_s) or not 0 <= timeout_s <= MAX_SECONDS:
            timeout_s = self.config.restart.stop_timeout_s
        self.loop.stop_requested = True
        self.ledger.goodput.stopping(self.clock.monotonic())
        self.timers.restart_at = self.timers.release_check_at = None
        self.loop.enter(State.STOPPING)
        self.systemd.notify("STOPPING=1")
        if self.run is not None and self.run.alive:
            self.live.stop(self.run, timeout_s)
        else:
            self.loop.enter(State.STOPPED)
        self.publish()

    def reap(self) -> None:
        """SIGCHLD: reap the child if it died, then any orphaned zombies."""
        run = self.run
        if run is not None and run.alive and run.pid is not None:
            try:
                status = self.ops.wait_nohang(run.pid)
                unknown = False
            except ChildProcessError:  # gone, status unknown: never taken for a success
                status, unknown = None, True
            if status is not None or unknown:
                self._child_died(run, status)
        keep = self.reporter.helper_pids()
        if self.run is not None and self.run.alive and self.run.pid is not None:
            keep.add(self.run.pid)
        self.ops.reap_orphans(keep)

    def _child_died(self, run: Run, status: int | None) -> None:
        """The death walk: the last words counted, the facts gathered, concluded, applied."""
        died = self.clock.monotonic()
        for drain in run.drains:  # everything it wrote is in the pipes: framed first
            drain.catch_up(CATCH_UP_S)
        if run.watcher is not None:
            run.watcher.flush()
        self.process_inbox()  # ...and its steps counted before the verdict
        cpu_s = mark_reaped(run, status, self.ops)
        if run.progress.unrecorded:
            self.observer.progress_record(run)  # the curve ends where the run did
        stopping, ended_at = self.loop.stop_requested, self.clock.time()
        facts = reaped_facts(
            run,
            status,
            died_mono=died,
            ended_at=ended_at,
            cpu_s=cpu_s,
            stopping=stopping,
            stop_at=self.ledger.goodput.stop_at,
        )
        self.ends.conclude(run, facts)
