"""One run after another, as the adapters see it: launch, reap, look for the dead run's release.

This is the executor's hands (:class:`~dflashd.supervisor.core.Hands`): each call does what
an effect asks and answers with the model's next input; nothing here decides or writes the
daemon's state.  The death walk starts here: :meth:`Runs.reap` takes the child's wait status,
counts its final output and gathers the facts (:mod:`reaped`) into a
:class:`~dflashd.supervisor.model.inputs.ChildExited`, which the model concludes
(:func:`~dflashd.supervisor.model.ending.conclude`, pure).  A relaunch waits until nothing of
the dead run is left (:mod:`endedruns`) and its GPU memory is released (:mod:`gpuwatch`).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Final

from dflashd.supervisor.endedruns import EndedRuns
from dflashd.supervisor.host.clock import Clock
from dflashd.supervisor.host.fdreserve import FdReserve
from dflashd.supervisor.host.handover import FirstLaunch
from dflashd.supervisor.host.notify import SystemdNotifier
from dflashd.supervisor.host.processops import ProcessOps
from dflashd.supervisor.host.room import room_at
from dflashd.supervisor.launcher import LaunchDeferred, Launcher
from dflashd.supervisor.liverun import LiveRunControl
from dflashd.supervisor.model.effects import Launch, LookForRelease, LookForSlowCauses
from dflashd.supervisor.model.inputs import (
    ChildExited,
    Input,
    Launched,
    LaunchPutOff,
    Reaped,
    ReleaseLooked,
)
from dflashd.supervisor.reaped import mark_reaped, reaped, spawn_failed_facts
from dflashd.supervisor.speak.recorder import Recorder
from dflashd.supervisor.watch.gpuwatch import GpuWatch
from dflashd.supervisor.watch.observe import RunObserver
from dflashd.supervisor.watch.run import FactsBook, Run
from dflashd.supervisor.watch.stackdumps import Dumper

# The child's final output is already in the pipes: framing them is quick, unless the log's
# disk pushes back; the sink drops after 2 s of a stalled write, so this bound is never hit
# by a healthy disk, and the exit record still follows every byte caught up.
CATCH_UP_S: Final = 5.0


@dataclass(frozen=True, slots=True)
class RunParts:
    """The adapters a run's life passes through, as :class:`Runs` calls them."""

    ops: ProcessOps
    reporter: Recorder
    gpu: GpuWatch
    observer: RunObserver
    launcher: Launcher
    live: LiveRunControl
    ended_runs: EndedRuns
    systemd: SystemdNotifier


@dataclass(frozen=True, slots=True)
class LoopCallbacks:
    """What only the loop does, called from a run's life: drain the inbox (the last steps
    before a verdict), publish the status, and the first launch's callback (``start`` waits
    for it)."""

    process_inbox: Callable[[], None]
    publish: Callable[..., str]  # (shown=, final=): publisher.Publisher.publish
    facts_of: FactsBook  # a run's facts (the model's)
    on_first_launch: FirstLaunch | None = None


class Runs:
    """Launch, reap and release: the executor's hands for a run's life."""

    def __init__(self, clock: Clock, parts: RunParts, callbacks: LoopCallbacks) -> None:
        self.clock, self.parts, self.callbacks = clock, parts, callbacks
        self.ops, self.reporter, self.gpu = parts.ops, parts.reporter, parts.gpu
        self.observer, self.launcher, self.live = parts.observer, parts.launcher, parts.live
        self.ended_runs, self.systemd = parts.ended_runs, parts.systemd
        self._on_first_launch = callbacks.on_first_launch
        self.fd_reserve = FdReserve()
        self._rng = random.Random()
        self.current: Callable[[], Run | None] = lambda: None  # the core's current run

    # -- launch ---------------------------------------------------------------------------

    def launch(self, effect: Launch) -> tuple[Run | None, Input]:
        """The next run: ``spawn`` on disk, the fork; answers launched, put off or spawn failed."""
        try:
            run, facts, error = self.launcher.launch(
                self.current(),
                self.callbacks.facts_of,
                clear_cache=effect.clear_cache,
                run_no=effect.run_no,
                best_before=effect.best_before,
                downtime_s=effect.downtime_s,
                visible_gpus=effect.visible_gpus,
            )
        except LaunchDeferred as deferred:
            freed = self.fd_reserve.release()  # room for the records and the next attempt
            put_off = LaunchPutOff(deferred.run_no, deferred.error, freed, effect.clear_cache)
            return self.current(), put_off
        self.fd_reserve.take()
        if error is not None:
            ended = spawn_failed_facts(facts, error, ended_at=self.clock.time())
            return run, ChildExited(ended, self._rng.random(), launched=facts)
        return run, Launched(facts)

    def prepare_standby(self, run: Run | None) -> None:
        """The run trains: the next run's interpreter started, its imports done (warm_standby)."""
        if run is not None and run.alive:
            self.launcher.prepare_standby(run)

    def keep_pace_baseline(self, run: Run) -> None:
        """The run's own step time was just learnt: the host as it is now, kept."""
        self.observer.keep_pace_baseline(run, self.clock.monotonic())

    def slow_causes(self, run: Run, look: LookForSlowCauses) -> Input:
        """What the host says slowed the run down."""
        return self.observer.slow_causes(run, look)

    def say_launched(self, run: Run | None, error: str | None) -> None:
        """``start``'s wait is answered, and systemd told READY once the launch is on disk."""
        if run is None:
            return
        if error is not None:
            self._first_launch({"ok": False, "run": run.run_no, "error": f"spawn failed: {error}"})
            return
        self._first_launch({"ok": True, "run": run.run_no, "pid": run.pid})
        if self.systemd.enabled:  # READY means the launch is in the log: on disk first
            self.reporter.flush(1.0)
            self.systemd.notify(f"READY=1\nSTATUS={self.callbacks.publish()}")

    def _first_launch(self, info: dict[str, Any]) -> None:
        callback, self._on_first_launch = self._on_first_launch, None
        if callback is not None:
            callback({**info, "log": str(self.reporter.log_path), "daemon_pid": os.getpid()})

    def look_for_release(self, run: Run | None, look: LookForRelease) -> Input:
        """What the dead run left running, else whether its GPU memory is released; and,
        asked for a relaunch a rule holds (``room_of``), how much room its filesystem has."""
        if not look.past_leftovers and (left := self.ended_runs.leftovers(run)) is not None:
            return ReleaseLooked(left)  # the model ends them (model/leftovers.py)
        check = self.gpu.release_check(run, self.ops, self.clock.monotonic())
        room_of = look.room_of
        room = None if room_of is None else room_at(room_of, self.launcher.config.cwd)
        return ReleaseLooked(None, check.holders, check.health, check.ecc_at_launch, room)

    def watch_empty(self, run: Run) -> None:
        """A thread waits for the dead run to empty, then wakes the loop."""
        self.ended_runs.watch_until_empty(run)

    # -- the executor's other hands ---------------------------------------------------------

    def hang_dump(self, run: Run) -> Input:
        """A proven hang: the sample that proved it written as the run's dump; the model
        kills it on the answer (model/killing.py)."""
        return self.live.hang_dump(run)

    def settle(self, run: Run, *, kill_now: bool) -> None:
        """The dead run's processes: killed now, or left to end before the next launch."""
        self.ended_runs.settle(run, kill_now=kill_now)

    def notify_systemd(self, text: str) -> None:
        """One sd_notify message."""
        self.systemd.notify(text)

    def publish(self, *, shown: bool = False, final: bool = False) -> str:
        """Write the status now."""
        return self.callbacks.publish(shown=shown, final=final)

    @property
    def dumps(self) -> Dumper:
        """The stack dumps (py-spy, or a test's double)."""
        return self.live.dumps

    def gpus_seen(self) -> list[dict[str, Any]]:
        """The GPUs' last sample (an alert carries it)."""
        return list(self.gpu.last)

    # -- death ----------------------------------------------------------------------------

    def reap(self, run: Run | None) -> Reaped | None:
        """SIGCHLD: reap the child if it died (its facts), then any orphaned zombies."""
        died: Reaped | None = None
        if run is not None and run.alive and run.pid is not None:
            try:
                status = self.ops.wait_nohang(run.pid)
                unknown = False
            except ChildProcessError:  # gone, status unknown: never taken for a success
                status, unknown = None, True
            if status is not None or unknown:
                died = self._child_died(run, status)
        keep = self.reporter.helper_pids()
        if run is not None and run.alive and run.pid is not None:
            keep.add(run.pid)
        self.ops.reap_orphans(keep)
        return died

    def _child_died(self, run: Run, status: int | None) -> Reaped:
        """The death walk: the final output counted, what the host says of the end read."""
        died = self.clock.monotonic()
        for drain in run.drains:  # everything it wrote is in the pipes: framed first
            drain.catch_up(CATCH_UP_S)
        if run.watcher is not None:
            run.watcher.flush()
        self.callbacks.process_inbox()  # ...and its steps counted before the verdict
        cpu_s = mark_reaped(run, status, self.ops)
        ended_at = self.clock.time()
        said = reaped(run, status, cpu_s, died_mono=died, ended_at=ended_at)
        return replace(said, jitter=self._rng.random())
