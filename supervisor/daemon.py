"""The daemon: the selector loop, timers, launch, reap and shutdown (what gunicorn's arbiter keeps).

The daemon's state (loop state, timers, ledger, the current run) is owned and written by
:mod:`core` alone, which applies the effects every room returns.  Everything else lives in
its own room and is called through a small interface: a run after another (:mod:`runs`),
the run (:mod:`run`), progress (:mod:`progress`), the GPU watch (:mod:`gpuwatch`), the end of
a run (:mod:`ending`, pure), status (:mod:`snapshot`), the run's processes (:mod:`custody`,
through the :mod:`groups` seam), recovery (:mod:`recovery`) and control (:mod:`control`).
The :class:`Seams` put a test's clock, processes, GPUs and dumps in place of the host.  Threads
(pipe drains, the log writer, the GPU poller, alert sinks, custody watchers) never call into
the loop: they post a message to the inbox and poke the wake pipe.  Signal handlers do
nothing: ``set_wakeup_fd`` carries the signal number to the same pipe.  Death is SIGCHLD
plus ``wait4`` on the child's pid, never pipe EOF.
Time comes from an injected :class:`Clock`, processes from an injected :class:`ProcessOps`,
so the loop tests drive this very code with a manual clock and scripted children.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from dflashd.supervisor.clock import Clock, SystemClock
from dflashd.supervisor.config import Config
from dflashd.supervisor.core import DaemonCore
from dflashd.supervisor.decide.effects import Deadline, SetTimer
from dflashd.supervisor.decide.hang import HangSampled
from dflashd.supervisor.endedruns import EndedRuns
from dflashd.supervisor.events import Event
from dflashd.supervisor.home import Home
from dflashd.supervisor.host.groups import HostProcesses
from dflashd.supervisor.host.processops import ProcessOps
from dflashd.supervisor.host.recovery import Restored, boot_id, restore
from dflashd.supervisor.host.runlog import unsaved_progress
from dflashd.supervisor.host.spawn import set_child_subreaper
from dflashd.supervisor.inbox import GpuSampled, Inbox, RunEmptied
from dflashd.supervisor.launcher import Launcher
from dflashd.supervisor.ledger import Ledger
from dflashd.supervisor.lifecycle import LoopState, State
from dflashd.supervisor.liverun import LiveRunControl
from dflashd.supervisor.run import Run
from dflashd.supervisor.runs import FirstLaunch, LoopHooks, RunRooms, Runs
from dflashd.supervisor.speak.control import stop_handler
from dflashd.supervisor.speak.daemonlog import reopen_daemon_log
from dflashd.supervisor.speak.diagnostics import get_logger
from dflashd.supervisor.speak.doors import Doors
from dflashd.supervisor.speak.reporter import MetricsUnavailable, Reporter
from dflashd.supervisor.speak.snapshot import goodput_totals, status_view
from dflashd.supervisor.speak.statusview import StatusView, one_line, read_state
from dflashd.supervisor.timers import Timers
from dflashd.supervisor.watch.gpuwatch import GpuSettings, GpuWatch, SamplerFactory
from dflashd.supervisor.watch.linewatch import LineMatcher, LineTap, LineWatcher
from dflashd.supervisor.watch.notify import NotifyMessage, SystemdNotifier
from dflashd.supervisor.watch.nvml import NvmlSampler
from dflashd.supervisor.watch.observe import RunObserver
from dflashd.supervisor.watch.progress import Limits
from dflashd.supervisor.watch.stackdumps import STACKS_BOUND_S, Dumper, StackDumps
from dflashd.supervisor.watch.stacks import StacksTaken

_WAKE: Final = b"\x00"
log = get_logger("dflashd")


class StartupError(Exception):
    """Something the daemon needs before launching is unusable; nothing was launched."""


@dataclass(frozen=True, slots=True)
class Seams:
    """What a test puts in place of the host (None: the real one): the clock, the processes,
    the GPU sampler, a tap on the run's frames, the stack dumps."""

    clock: Clock | None = None
    ops: ProcessOps | None = None
    sampler_factory: SamplerFactory | None = None
    line_tap: LineTap | None = None
    dumps: Dumper | None = None


class Daemon:
    """One supervised job in one home directory: the loop and what only the loop may do."""

    def __init__(
        self,
        home: Home,
        config: Config,
        *,
        seams: Seams | None = None,
        on_first_launch: FirstLaunch | None = None,
    ) -> None:
        seams = seams or Seams()
        self.home, self.config = home, config
        self.clock = clock = seams.clock or SystemClock()
        self.ops = seams.ops or HostProcesses(home.id)
        self._sampler_factory = seams.sampler_factory or (lambda _pid: NvmlSampler(config.gpus))
        self._opened = False  # open() finished: the start was not refused
        self.started_wall = clock.time()
        self.inbox = Inbox()
        self._systemd = SystemdNotifier.from_environ(dict(os.environ))
        matcher = LineMatcher(
            config.first_step_pattern, config.step_pattern, config.builtin_formats
        )
        c = config
        self._limits = Limits(
            c.first_step_timeout_s, c.stall_timeout_s, c.hang_suspect_s, c.remote_wait_s
        )
        self.gpu = GpuWatch(GpuSettings.from_config(config))
        self.boot_id = boot_id()
        self.reporter = Reporter(home, config, self._systemd, clock)
        emptied = lambda run_no: self.inbox.post(RunEmptied(run_no))  # noqa: E731
        self.ended_runs = EndedRuns(self.ops, self.reporter, emptied)
        self.core = DaemonCore(
            config, clock, self.reporter, self.ended_runs, self.gpu, self._publish
        )
        self.observer = RunObserver(
            self.reporter, self.gpu, self.ops, self.core.ledger, config.alerts.on, self.core.apply
        )
        self.dumps = seams.dumps or StackDumps(
            home, self.reporter, self.inbox.post, clock.monotonic
        )
        self.live = LiveRunControl(clock, self.reporter, self.observer, self._limits, self.dumps)
        tap = seams.line_tap
        watcher = lambda run_no: LineWatcher(run_no, matcher, clock.monotonic, self.inbox.post, tap)  # noqa: E731
        launcher = Launcher(home, config, clock, self.ops, self.reporter, self.gpu, watcher)
        rooms = RunRooms(
            self.ops,
            self.reporter,
            self.gpu,
            self.observer,
            launcher,
            self.live,
            self.ended_runs,
            self._systemd,
        )
        hooks = LoopHooks(self._last_words, self._publish, on_first_launch)
        self.runs = Runs(config, clock, self.core, rooms, hooks)
        self.doors: Doors | None = None

    @property
    def loop(self) -> LoopState:
        """The loop's state (the core owns it)."""
        return self.core.loop

    @property
    def timers(self) -> Timers:
        """The loop's deadlines (the core owns them)."""
        return self.core.timers

    @property
    def ledger(self) -> Ledger:
        """The counters kept between runs (the core owns them)."""
        return self.core.ledger

    # -- entry points ---------------------------------------------------------------------

    def serve(self) -> int:
        """Run until stopped, completed or fatal; returns the process exit code."""
        self.inbox.catch_signals()
        set_child_subreaper()
        try:
            try:
                self.open()
            except OSError as exc:  # a socket or file of the home cannot be made: refuse the start
                raise StartupError(f"{exc.filename or self.home.root}: {exc.strerror}") from None
            self._opened = True
            self._loop()
        except StartupError:
            raise
        except Exception as exc:  # the last-resort guard: record, end the child, never vanish
            self.core.daemon_failed(self.run, exc)
        finally:
            self.close()
        return self.loop.exit_code

    @property
    def state(self) -> State:
        """The daemon's state (see :class:`LoopState`)."""
        return self.loop.state

    @property
    def run(self) -> Run | None:
        """The current (or last) run."""
        return self.core.run

    def reap(self) -> None:
        """SIGCHLD: see :meth:`Runs.reap`."""
        self.runs.reap()

    def request_stop(self, timeout_s: float) -> None:
        """``dflashd stop``, SIGTERM, SIGINT: see :meth:`Runs.request_stop`."""
        self.runs.request_stop(timeout_s)

    def open(self) -> None:
        """Everything before the loop: history, sockets, recovery, GPUs, metrics, the first launch."""
        self.reporter.open_history()
        stop_s = self.config.restart.stop_timeout_s
        stop = stop_handler(stop_s, self.request_stop, lambda: self.run, STACKS_BOUND_S)
        handlers = {
            "status": lambda _: self._status_shown(),
            "stop": stop,
            "stacks": lambda req: self.live.command(self.run, req),
        }
        self.doors = Doors(
            self.home, self.clock, self.inbox.read_fd, handlers, self.reporter.home_dir.fd
        )
        restored = _restore(self, read_state(self.home.state_file, self.reporter.home_dir.fd) or {})
        self.core.apply(None, restored.effects)
        if restored.lost is not None:  # a run the dead daemon never saw end: concluded as any other
            self.core.conclude(None, restored.lost)
        child_pid = lambda: self.run.pid if self.run else None  # noqa: E731
        off = self.gpu.begin(
            self.config.gpus_enabled, self._sampler_factory, child_pid, self.inbox.post_gpu
        )
        self.core.apply(None, (off,) if off is not None else ())
        try:
            self.reporter.start_metrics()  # before the launch: a busy address refuses the start
        except MetricsUnavailable as exc:
            raise StartupError(str(exc)) from None
        if self._systemd.watchdog_interval_s:
            self.core.apply(None, (SetTimer(Deadline.WATCHDOG, self.clock.monotonic()),))
        self.runs.launch()
        if self.gpu.poller is not None:
            self.gpu.poller.start()  # after the launch: the first poll already sees the child

    def turn(self) -> None:
        """One pass of the loop's work after the selector wakes: the inbox, then the timers."""
        self._process_inbox()
        self._on_timers()

    def _process_inbox(self) -> None:
        for message in self.inbox.messages():
            now = self.clock.monotonic()
            if isinstance(message, RunEmptied):
                self.runs.emptied(message.run_no, now)
            elif isinstance(message, StacksTaken):
                self.live.taken(self.run, message)
            elif isinstance(message, HangSampled):
                self.live.hang_sampled(self.run, message)
            elif isinstance(message, GpuSampled):
                end = self.observer.gpu_sample(self.run, message.sample, now)
                if end is not None and self.run is not None:
                    self.live.end(self.run, end)
                self.core.changed()
            elif self.observer.lines(self.run, message, now):
                self.core.changed()

    # -- the loop -------------------------------------------------------------------------

    def _loop(self) -> None:
        assert self.doors is not None
        while not self.loop.done:
            knocks = self.doors.wait(self.next_timeout())
            self._heard(knocks.said)  # before a SIGCHLD: a datagram was sent before the death
            if knocks.woken:
                self._on_wake()
            self.turn()

    def _heard(self, said: list[NotifyMessage]) -> None:
        for msg in said:
            if self.observer.notify(self.run, msg, self.clock.monotonic()):
                self.core.changed()

    def _last_words(self) -> None:
        """Before a verdict: the datagrams still waiting on notify.sock, then the inbox."""
        if self.doors is not None:
            self._heard(self.doors.notify.receive())
        self._process_inbox()

    def next_timeout(self) -> float | None:
        """How long the selector may sleep: None when nothing is due (no periodic wake-ups)."""
        expiry = self.doors.next_expiry() if self.doors is not None else None
        return self.timers.next_timeout(self.run, self._limits, self.clock.monotonic(), expiry)

    def _on_wake(self) -> None:
        for signum in self.inbox.signals():
            if signum == signal.SIGCHLD:
                self.reap()
            elif signum in (signal.SIGTERM, signal.SIGINT):
                self.request_stop(self.config.restart.stop_timeout_s)
            elif signum in (signal.SIGHUP, signal.SIGUSR1):
                self.reopen(signal.Signals(signum).name)
            else:  # SIGUSR2, timers, SIGIO, SIGPWR, terminal stops: noted, never fatal
                log.info("signal_ignored", signal=signal.Signals(signum).name)

    def reopen(self, why: str) -> None:
        """SIGHUP/SIGUSR1: re-open what an admin may have moved, and dump the status.

        The control socket is bound again if its file was removed, daemon.log is re-opened
        if it was rotated away, and the status goes to daemon.log, as one record.
        """
        if self.doors is not None:
            self.doors.reopen()
        reopen_daemon_log()
        log.info("status_dump", signal=why, **dict(self.status()))

    def _on_timers(self) -> None:
        now = self.clock.monotonic()
        run = self.run
        core = self.core
        if core.take_due(Deadline.WATCHDOG, now):
            self._systemd.notify("WATCHDOG=1")
            every = self._systemd.watchdog_interval_s or 1.0
            core.apply(run, (SetTimer(Deadline.WATCHDOG, now + every),))
        watcher = run.watcher if run is not None and run.alive else None
        if watcher is not None and watcher.flush_if_due(now):
            self._process_inbox()  # a step printed, then quiet: counted now
        self.live.check(run, now, stop_due=core.take_due(Deadline.STOP, now))
        for due in (Deadline.RESTART, Deadline.RELEASE_CHECK):
            if core.take_due(due, now):
                self.runs.relaunch_when_released(now)
        if core.timers.state_write_due(now):
            self._publish()

    # -- control and status ---------------------------------------------------------------

    def status(self) -> StatusView:
        """The ``status --json`` object (docs/design.md, "Status")."""
        return status_view(self)

    def _status_shown(self) -> dict[str, Any]:
        """``status`` for a client, published and saved as shown: no total shown goes back."""
        view = self.status()
        self._publish(view, shown=True)
        return dict(view)

    def _publish(self, view: StatusView | None = None, *, shown: bool = False) -> str:
        """state.json, metrics and systemd's STATUS= from one snapshot; returns its one line."""
        self.core.published(self.clock.monotonic())
        view = view or self.status()  # built once per publish
        summary = one_line(view)
        self.reporter.publish(view, summary)
        self._save_goodput(ended=False, shown=shown)
        return summary

    def _save_goodput(self, *, ended: bool, shown: bool = False) -> None:
        totals, best = goodput_totals(self)
        first_start, now = self.ledger.goodput.first_start, self.clock.monotonic()
        self.reporter.save_goodput(
            first_start, totals, best_step=best, daemon_ended=ended, now=now, shown=shown
        )

    # -- shutdown -------------------------------------------------------------------------

    def close(self) -> None:
        """End every run's processes, wait for the pipes, close the log and the sockets.

        Never raises: each step that fails (out of descriptors, a full disk) is logged and
        the next one still runs, so the log is always flushed and closed.
        """
        run = self.run
        own = isinstance(self.ops, HostProcesses)
        self.runs.fd_reserve.release()  # the last steps may need descriptors the job's end did not free
        steps: list[tuple[str, Callable[[], object]]] = [
            ("alerts", self.reporter.alerts.close),  # first: an alert going out is not swept
            ("sweep", lambda: self.ended_runs.sweep(run, own_descendants=own)),
            ("drains", lambda: [d.wait_eof(2.0) for d in (run.drains if run is not None else ())]),
            ("gpu", self.gpu.stop),
            (
                "daemon_exit",
                lambda: self.reporter.record(
                    run.run_no if run else 0, Event.DAEMON_EXIT, state=self.state.value
                ),
            ),
            # a refused start leaves status as it was: no phantom "starting" state
            ("state", lambda: self._publish() if self._opened else None),
            ("goodput", lambda: self._save_goodput(ended=True) if self._opened else None),
            ("reporter", self.reporter.close),
            ("doors", lambda: self.doors.close() if self.doors is not None else None),
            ("inbox", self.inbox.close),
            ("cgroups", self.ops.close),
        ]
        for name, step in steps:
            try:
                step()
            except Exception as exc:
                log.error("close_step_failed", step=name, error=repr(exc))


def _restore(daemon: Daemon, previous: dict[str, Any]) -> Restored:
    """What start-up carries over (:func:`~dflashd.supervisor.host.recovery.restore`, pure),
    once what a dead daemon left is ended, proven ours (the host's part)."""
    history, writer = daemon.reporter.history, daemon.reporter.writer
    saved = history.goodput() if history is not None else None
    now_wall, now_mono = daemon.clock.time(), daemon.clock.monotonic()
    stop_s = daemon.config.restart.stop_timeout_s
    leftovers = daemon.ops.recover(previous, daemon.boot_id, stop_s)
    logged = unsaved_progress(saved, previous, daemon.home.logs)
    return restore(
        previous,
        saved_goodput=saved,
        leftovers=leftovers,
        torn_bytes=writer.torn_bytes,
        last_run=writer.last_run,
        now_wall=now_wall,
        now_mono=now_mono,
        logged=logged,
    )
