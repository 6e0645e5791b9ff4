"""One run after another, as the loop sees it: launch, stop, reap, relaunch once released.

The death walk starts here and reads reap -> conclude -> apply: :meth:`Runs.reap` takes the
child's wait status, :meth:`Runs._child_died` counts its last words and gathers the facts
(:mod:`reaped`), and :meth:`~dflashd.supervisor.core.DaemonCore.conclude` concludes (pure,
:mod:`ending`) and applies.  What a launch, a deferral, a stop and a release check change is
said as effects (:mod:`effects`) and carried out by the core, the one writer of the state.  A relaunch waits until nothing of the dead run is left
(:mod:`endedruns`) and its GPU memory is released (:mod:`gpuwatch`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from dflashd.supervisor.bounds import MAX_SECONDS
from dflashd.supervisor.clock import Clock
from dflashd.supervisor.config import Config
from dflashd.supervisor.core import DaemonCore
from dflashd.supervisor.decide.effects import (
    Book,
    Deadline,
    Effect,
    EnterState,
    RunLaunched,
    SetTimer,
    StopAsked,
    WriteRecord,
)
from dflashd.supervisor.endedruns import EndedRuns
from dflashd.supervisor.events import Event
from dflashd.supervisor.host.fdreserve import FdReserve
from dflashd.supervisor.host.processops import ProcessOps
from dflashd.supervisor.launcher import LaunchDeferred, Launcher
from dflashd.supervisor.lifecycle import State
from dflashd.supervisor.liverun import LiveRunControl
from dflashd.supervisor.reaped import mark_reaped, reaped_facts, spawn_failed_facts
from dflashd.supervisor.run import Run
from dflashd.supervisor.speak.recorder import Recorder
from dflashd.supervisor.watch.gpuwatch import GpuWatch
from dflashd.supervisor.watch.notify import SystemdNotifier
from dflashd.supervisor.watch.observe import RunObserver

LAUNCH_RETRY_S: Final = 1.0  # a launch deferred for want of descriptors is tried again after this
# The child's last words are already in the pipes: framing them is quick, unless the log's
# disk pushes back; the sink drops after 2 s of a stalled write, so this bound is never hit
# by a healthy disk, and the exit record still follows every byte caught up.
CATCH_UP_S: Final = 5.0

FirstLaunch = Callable[[dict[str, Any]], None]


@dataclass(frozen=True, slots=True)
class RunRooms:
    """The rooms a run's life passes through, as :class:`Runs` calls them."""

    ops: ProcessOps
    reporter: Recorder
    gpu: GpuWatch
    observer: RunObserver
    launcher: Launcher
    live: LiveRunControl
    ended_runs: EndedRuns
    systemd: SystemdNotifier


@dataclass(frozen=True, slots=True)
class LoopHooks:
    """What only the loop does, called from a run's life: drain the inbox (the last steps
    before a verdict), publish the status, and the first launch's callback (``start`` waits
    for it)."""

    process_inbox: Callable[[], None]
    publish: Callable[[], str]
    on_first_launch: FirstLaunch | None = None


def deferred_launch(
    run_no: int, error: str, *, freed: int, clear_cache: bool, now: float
) -> tuple[Effect, ...]:
    """A launch deferred for want of a resource the host gives back: said, the cache
    clearing kept for the next attempt, tried again after :data:`LAUNCH_RETRY_S`."""
    fields = {"error": error, "retry_in_s": LAUNCH_RETRY_S, "reserve_freed": freed}
    return (
        WriteRecord(Event.LAUNCH_DEFERRED, fields, log_level="warning", run_no=run_no),
        Book(clear_cache_next=clear_cache),
        SetTimer(Deadline.RESTART, now + LAUNCH_RETRY_S),
    )


def stop_effects(*, alive: bool, now: float) -> tuple[Effect, ...]:
    """``dflashd stop``: no relaunch from now on; stopping while a run lives, else stopped."""
    stopping = (StopAsked(now), EnterState(State.STOPPING))
    return stopping if alive else (*stopping, EnterState(State.STOPPED))


class Runs:
    """The current run and what the loop does to it between launches."""

    def __init__(
        self, config: Config, clock: Clock, core: DaemonCore, rooms: RunRooms, hooks: LoopHooks
    ) -> None:
        self.config, self.clock, self.core, self.rooms = config, clock, core, rooms
        self.ops, self.reporter, self.gpu = rooms.ops, rooms.reporter, rooms.gpu
        self.observer, self.launcher, self.live = rooms.observer, rooms.launcher, rooms.live
        self.ended_runs, self.systemd = rooms.ended_runs, rooms.systemd
        self.hooks = hooks
        self._on_first_launch = hooks.on_first_launch
        self.fd_reserve = FdReserve()
        self._deferred_run_no: int | None = None

    @property
    def run(self) -> Run | None:
        """The current (or last) run (the core holds it)."""
        return self.core.run

    # -- launch ---------------------------------------------------------------------------

    def relaunch_when_released(self, now: float) -> None:
        """Launch once nothing of the dead run lives and its GPU memory is released."""
        if (wait := self.ended_runs.end_leftovers(self.run, now)) is not None:
            # nothing of the dead run lives into the next
            self.core.apply(self.run, (SetTimer(Deadline.RELEASE_CHECK, wait),))
            return
        check = self.gpu.release_check(self.run, self.ops, now)
        self.core.apply(self.run, check.effects)
        if check.ready:
            self.launch()

    def emptied(self, run_no: int, now: float) -> None:
        """The dead run's last process is gone (a custody watcher said so): relaunch now."""
        run = self.run
        waiting = self.core.timers.release_check_at is not None
        if waiting and run is not None and run.run_no == run_no and not run.alive:
            self.core.apply(run, (SetTimer(Deadline.RELEASE_CHECK, None),))
            self.relaunch_when_released(now)

    def launch(self) -> None:
        """The next run: ``spawn`` on disk, the fork, ``launched`` (or a deferral, or a verdict)."""
        core = self.core
        clear = core.ledger.clear_cache_next
        core.apply(self.run, (EnterState(State.STARTING), Book(clear_cache_next=False)))
        run_no, self._deferred_run_no = self._deferred_run_no, None
        goodput, now = core.ledger.goodput, self.clock.monotonic()
        try:
            run, error = self.launcher.launch(
                self.run,
                clear_cache=clear,
                run_no=run_no,
                best_before=goodput.best_before(core.ledger.history.best_step),
                downtime_s=goodput.downtime_s(now),
            )
        except LaunchDeferred as deferred:
            freed = self.fd_reserve.release()  # room for the records and the next attempt
            self._deferred_run_no = deferred.run_no
            effects = deferred_launch(
                deferred.run_no,
                deferred.error,
                freed=freed,
                clear_cache=clear,
                now=self.clock.monotonic(),
            )
            core.apply(self.run, effects)
            return
        self.fd_reserve.take()
        core.apply(run, (RunLaunched(run.started_mono),))  # the current run from now on
        if error is not None:
            stopping, stop_at = core.loop.stop_requested, goodput.stop_at
            ended_at = self.clock.time()
            facts = spawn_failed_facts(
                run, error, ended_at=ended_at, stopping=stopping, stop_at=stop_at
            )
            core.conclude(run, facts)
            self._first_launch({"ok": False, "run": run.run_no, "error": f"spawn failed: {error}"})
            return
        core.apply(run, (EnterState(State.RUNNING),))
        summary = self.hooks.publish()
        self._first_launch({"ok": True, "run": run.run_no, "pid": run.pid})
        if self.systemd.enabled:  # READY means the launch is in the log: on disk first
            self.reporter.flush(1.0)
            self.systemd.notify(f"READY=1\nSTATUS={summary}")

    def _first_launch(self, info: dict[str, Any]) -> None:
        callback, self._on_first_launch = self._on_first_launch, None
        if callback is not None:
            callback({**info, "log": str(self.reporter.log_path), "daemon_pid": os.getpid()})

    # -- stop and death -------------------------------------------------------------------

    def request_stop(self, timeout_s: float) -> None:
        """Stop: SIGTERM to the child's group, SIGKILL after ``timeout_s``, then exit."""
        loop = self.core.loop
        if loop.stop_requested or loop.done:
            return
        if not math.isfinite(timeout_s) or not 0 <= timeout_s <= MAX_SECONDS:
            timeout_s = self.config.restart.stop_timeout_s
        run = self.run
        alive = run is not None and run.alive
        self.core.apply(run, stop_effects(alive=alive, now=self.clock.monotonic()))
        self.systemd.notify("STOPPING=1")
        if run is not None and alive:
            self.live.stop(run, timeout_s)
        self.hooks.publish()

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
        self.hooks.process_inbox()  # ...and its steps counted before the verdict
        cpu_s = mark_reaped(run, status, self.ops)
        if run.progress.unrecorded:
            self.observer.progress_record(run)  # the curve ends where the run did
        stopping, ended_at = self.core.loop.stop_requested, self.clock.time()
        facts = reaped_facts(
            run,
            status,
            died_mono=died,
            ended_at=ended_at,
            cpu_s=cpu_s,
            stopping=stopping,
            stop_at=self.core.ledger.goodput.stop_at,
        )
        self.core.conclude(run, facts)
