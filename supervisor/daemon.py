"""The daemon: the selector loop, timers, launch, reap and shutdown (what gunicorn's arbiter keeps).

Everything else lives in its own room and is called through a small interface: the run
(:mod:`run`), progress (:mod:`progress`), the GPU watch (:mod:`gpuwatch`), the end of a run
(:mod:`ending`, pure), status (:mod:`status`), the run's processes (:mod:`custody`, through
the :mod:`groups` seam), recovery (:mod:`recovery`) and control (:mod:`control`).  Threads
(pipe drains, the log writer, the GPU poller, alert sinks, custody watchers) never call into
the loop: they post a message to the inbox and poke the wake pipe.  Signal handlers do
nothing: ``set_wakeup_fd`` carries the signal number to the same pipe.  Death is SIGCHLD
plus ``wait4`` on the child's pid, never pipe EOF.
Time comes from an injected :class:`Clock`, processes from an injected :class:`ProcessOps`,
so the loop tests drive this very code with a manual clock and scripted children.
"""

from __future__ import annotations

import math
import os
import selectors
import signal
import traceback
from collections.abc import Callable
from typing import Any, Final

from dflashd.supervisor.aftermath import Aftermath, Ledger
from dflashd.supervisor.clock import Clock, SystemClock
from dflashd.supervisor.config import MAX_SECONDS, Config
from dflashd.supervisor.control import ControlServer, stop_handler
from dflashd.supervisor.daemonlog import reopen_daemon_log
from dflashd.supervisor.diagnostics import get_logger
from dflashd.supervisor.ending import EXIT_FATAL, Outcome
from dflashd.supervisor.events import Event
from dflashd.supervisor.fdreserve import FdReserve
from dflashd.supervisor.gpu import NvmlSampler
from dflashd.supervisor.gpuwatch import GpuSettings, GpuWatch, SamplerFactory
from dflashd.supervisor.groups import HostProcesses, ProcessOps
from dflashd.supervisor.home import Home
from dflashd.supervisor.inbox import GpuSampled, Inbox, RunEmptied
from dflashd.supervisor.launch import set_child_subreaper
from dflashd.supervisor.launching import LaunchDeferred, Launcher
from dflashd.supervisor.lifecycle import State, transition
from dflashd.supervisor.notify import NotifyServer, SystemdNotifier
from dflashd.supervisor.observe import RunObserver
from dflashd.supervisor.progress import Limits, LineMatcher, LineTap, LineWatcher
from dflashd.supervisor.recovery import boot_id
from dflashd.supervisor.reporting import MetricsUnavailable, Reporter
from dflashd.supervisor.run import Run
from dflashd.supervisor.statefile import read_state
from dflashd.supervisor.status import StatusView, one_line, status_view
from dflashd.supervisor.timers import Timers
from dflashd.supervisor.verdicts import Observations

_WAKE: Final = b"\x00"
log = get_logger("dflashd")
_DONE_STATES: Final = (State.STOPPED, State.FATAL, State.COMPLETED)
LAUNCH_RETRY_S: Final = 1.0  # a launch deferred for want of descriptors is tried again after this


FirstLaunch = Callable[[dict[str, Any]], None]


class StartupError(Exception):
    """Something the daemon needs before launching is unusable; nothing was launched."""


class Daemon:
    """One supervised job in one home directory: the loop and what only the loop may do."""

    def __init__(
        self,
        home: Home,
        config: Config,
        *,
        clock: Clock | None = None,
        ops: ProcessOps | None = None,
        sampler_factory: SamplerFactory | None = None,
        on_first_launch: FirstLaunch | None = None,
        line_tap: LineTap | None = None,
    ) -> None:
        self.home, self.config = home, config
        self.clock = clock or SystemClock()
        self.ops = ops or HostProcesses(home.id)
        self._sampler_factory = sampler_factory or (lambda _pid: NvmlSampler(config.gpus))
        self._on_first_launch = on_first_launch
        self.state = State.STARTING
        self.run: Run | None = None
        self.ledger = Ledger()
        self.timers = Timers()
        self.exit_code = 0
        self.started_wall = self.clock.time()
        self.inbox = Inbox()
        self._selector = selectors.DefaultSelector()
        self._stop_requested = False
        self._systemd = SystemdNotifier.from_environ(dict(os.environ))
        self._matcher = LineMatcher(
            config.first_step_pattern, config.step_pattern, config.builtin_formats
        )
        self._limits = Limits(config.first_step_timeout_s, config.stall_timeout_s)
        self.gpu = GpuWatch(GpuSettings.from_config(config))
        self.boot_id = boot_id()
        self.reporter = Reporter(home, config, self._systemd)
        self.observer = RunObserver(self.reporter, self.gpu, self.ops, self.ledger)
        self.launcher = Launcher(
            home,
            config,
            self.clock,
            self.ops,
            self.reporter,
            self.gpu,
            lambda run_no: LineWatcher(
                run_no, self._matcher, self.clock.monotonic, self.inbox.post, line_tap
            ),
            sees_steps=self._matcher.configured,
        )
        self.aftermath = Aftermath(
            config, self.clock, self.ops, self.reporter, self.observer, self.ledger
        )
        self.aftermath.on_empty = lambda run_no: self.inbox.post(RunEmptied(run_no))
        self.control: ControlServer | None = None
        self.notify: NotifyServer | None = None
        self._control_check_at = 0.0
        self._deferred_run_no: int | None = None
        self._fd_reserve = FdReserve()

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
            self._loop()
        except StartupError:
            raise
        except Exception as exc:  # the last-resort guard: record, end the child, never vanish
            self._daemon_failed(exc)
        finally:
            self.close()
        return self.exit_code

    def open(self) -> None:
        """Everything before the loop: history, sockets, recovery, GPUs, metrics, the first launch."""
        self.reporter.open_history()
        stop = stop_handler(self.config.restart.stop_timeout_s, self.request_stop, lambda: self.run)
        handlers = {"status": lambda _: dict(self.status()), "stop": stop}
        self.control = ControlServer(self.home.control_socket, handlers, self.clock.monotonic)
        self.notify = NotifyServer(self.home.notify_socket)
        self._selector.register(self.inbox.read_fd, selectors.EVENT_READ, "wake")
        self._selector.register(self.notify.fileno(), selectors.EVENT_READ, "notify")
        self._selector.register(self.control.sock, selectors.EVENT_READ, "control")
        self.aftermath.restore(read_state(self.home.state_file) or {}, self.home, self.boot_id)
        child_pid = lambda: self.run.pid if self.run else None  # noqa: E731
        off = self.gpu.begin(
            self.config.gpus_enabled, self._sampler_factory, child_pid, self.inbox.post_gpu
        )
        if off is not None:
            self.reporter.event(0, off[0], **off[1])
        try:
            self.reporter.start_metrics()  # before the launch: a busy address refuses the start
        except MetricsUnavailable as exc:
            raise StartupError(str(exc)) from None
        if self._systemd.watchdog_interval_s:
            self.timers.watchdog_at = self.clock.monotonic()
        self._launch()
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
                run = self.run
                waiting = self.timers.release_check_at is not None
                if waiting and run is not None and run.run_no == message.run_no and not run.alive:
                    self.timers.release_check_at = None
                    self._relaunch_when_released(now)
                continue
            if isinstance(message, GpuSampled):
                end = self.observer.gpu_sample(self.run, message.sample, now)
                if end is not None and self.run is not None:
                    self.aftermath.end_run(self.run, end)
                self.timers.state_dirty = True
            elif self.observer.lines(self.run, message, now):
                self.timers.state_dirty = True

    # -- the loop -------------------------------------------------------------------------

    def _loop(self) -> None:
        while self.state not in _DONE_STATES:
            for key, _ in self._selector.select(self.next_timeout()):
                if key.data == "wake":
                    self._on_wake()
                elif key.data == "notify" and self.notify is not None:
                    for msg in self.notify.receive():
                        if self.observer.notify(self.run, msg, self.clock.monotonic()):
                            self.timers.state_dirty = True
                elif key.data == "control" and self.control is not None:
                    self.control.on_event(self._selector, key.fileobj)
            if self.control is not None:
                self.control.expire(self._selector)
                self._check_control_socket()
            self.turn()

    def _check_control_socket(self) -> None:
        """A removed control.sock is made again (looked at most once a second, on wake-ups)."""
        now = self.clock.monotonic()
        if self.control is None or now < self._control_check_at:
            return
        self._control_check_at = now + 1.0
        if self.control.socket_missing():
            log.warning("control_socket_rebound", path=str(self.home.control_socket))
            self.control.rebind(self._selector)

    def next_timeout(self) -> float | None:
        """How long the selector may sleep: None when nothing is due (no periodic wake-ups)."""
        expiry = self.control.next_expiry() if self.control is not None else None
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
        if self.control is not None and self.control.socket_missing():
            self.control.rebind(self._selector)
        reopen_daemon_log()
        log.info("status_dump", signal=why, **dict(self.status()))

    def _on_timers(self) -> None:
        now = self.clock.monotonic()
        run = self.run
        if self.timers.watchdog_at is not None and now >= self.timers.watchdog_at:
            self._systemd.notify("WATCHDOG=1")
            self.timers.watchdog_at = now + (self._systemd.watchdog_interval_s or 1.0)
        if run is not None and run.alive and run.pid is not None:
            if run.watcher is not None and run.watcher.flush_if_due(now):
                self._process_inbox()  # a step printed, then quiet: counted now
            if run.kill_at_mono is not None and now >= run.kill_at_mono:
                run.kill_at_mono = None
                if run.custody is not None:
                    run.custody.kill_all()
            stall = None if run.ended_by_us else run.progress.stall_deadline(self._limits)
            if stall is not None and now >= stall and (why := self.observer.stall_reason(run, now)):
                self.aftermath.end_run(run, why)
        if self.timers.stop_deadline is not None and now >= self.timers.stop_deadline:
            self.timers.stop_deadline = None
            if run is not None and run.alive and run.pid is not None:
                self.reporter.event(run.run_no, Event.STOP_TIMEOUT, signal="SIGKILL")
                if run.custody is not None:
                    run.custody.kill_all()
        for due in ("restart_at", "release_check_at"):
            if (at := getattr(self.timers, due)) is not None and now >= at:
                setattr(self.timers, due, None)
                self._relaunch_when_released(now)
        if self.timers.state_write_due(now):
            self._publish()

    # -- launch ---------------------------------------------------------------------------

    def _relaunch_when_released(self, now: float) -> None:
        if (wait := self.aftermath.end_leftovers(self.run, now)) is not None:
            self.timers.release_check_at = wait  # nothing of the dead run lives into the next
            return
        check = self.gpu.release_check(self.run, self.ops, now)
        for event, fields in check.records:
            self.reporter.event(self.run.run_no if self.run else 0, event, **fields)
        custody = self.run.custody if self.run is not None else None
        for pid in check.kill:
            if custody is not None:  # a holder proven to belong to the dead run
                custody.signal_pid(pid, signal.SIGKILL)
        if check.ready:
            self._launch()
        else:
            self.timers.release_check_at = check.retry_at

    def _launch(self) -> None:
        if self.state is not State.STARTING:
            self.state = transition(self.state, State.STARTING)
        clear, self.ledger.clear_cache_next = self.ledger.clear_cache_next, False
        run_no, self._deferred_run_no = self._deferred_run_no, None
        try:
            run, error = self.launcher.launch(self.run, clear_cache=clear, run_no=run_no)
        except LaunchDeferred as deferred:
            freed = self._fd_reserve.release()  # room for the records and the next attempt
            self.reporter.announce(
                deferred.run_no,
                Event.LAUNCH_DEFERRED,
                "warning",
                error=deferred.error,
                retry_in_s=LAUNCH_RETRY_S,
                reserve_freed=freed,
            )
            self._deferred_run_no = deferred.run_no
            self.ledger.clear_cache_next = clear
            self.timers.restart_at = self.clock.monotonic() + LAUNCH_RETRY_S
            return
        self._fd_reserve.take()
        self.run = run
        if error is not None:
            obs = Observations(spawn_error=error)
            self._after(self.aftermath.conclude(run, obs, 0.0, (), self._stop_requested))
            self._announce({"ok": False, "run": run.run_no, "error": f"spawn failed: {error}"})
            return
        self.state = transition(self.state, State.RUNNING)
        self._publish()
        self._announce({"ok": True, "run": run.run_no, "pid": run.pid})
        if self._systemd.enabled:  # READY means the launch is in the log: on disk first
            self.reporter.sink.flush(1.0)
            self._systemd.notify(f"READY=1\nSTATUS={one_line(self.status())}")

    def _announce(self, info: dict[str, Any]) -> None:
        callback, self._on_first_launch = self._on_first_launch, None
        if callback is not None:
            callback({**info, "log": str(self.reporter.log_path), "daemon_pid": os.getpid()})

    # -- the end of a run -----------------------------------------------------------------

    def request_stop(self, timeout_s: float) -> None:
        """Stop: SIGTERM to the child's group, SIGKILL after ``timeout_s``, then exit."""
        if self._stop_requested or self.state in _DONE_STATES:
            return
        if not math.isfinite(timeout_s) or not 0 <= timeout_s <= MAX_SECONDS:
            timeout_s = self.config.restart.stop_timeout_s
        self._stop_requested = True
        self.timers.restart_at = self.timers.release_check_at = None
        if self.state is not State.STOPPING:
            self.state = transition(self.state, State.STOPPING)
        self._systemd.notify("STOPPING=1")
        if self.run is not None and self.run.alive:
            self.aftermath.stop_run(self.run, timeout_s)
            self.timers.stop_deadline = self.clock.monotonic() + timeout_s
        else:
            self.state = transition(self.state, State.STOPPED)
        self._publish()

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
                self.aftermath.catch_up(run)  # the last words, framed...
                if run.watcher is not None:
                    run.watcher.flush()
                self._process_inbox()  # ...and their steps counted before the verdict
                self._after(self.aftermath.child_died(run, status, self._stop_requested))
        keep = set(self.reporter.alerts.pids)
        if self.run is not None and self.run.alive and self.run.pid is not None:
            keep.add(self.run.pid)
        self.ops.reap_orphans(keep)

    def _after(self, outcome: Outcome) -> None:
        """The loop's share of a run's end: the state machine, the restart timer, the exit code."""
        if outcome.next_state is not self.state:
            self.state = transition(self.state, outcome.next_state)
        if outcome.restart_delay_s is not None:
            self.timers.restart_at = self.clock.monotonic() + outcome.restart_delay_s
        if outcome.daemon_exit_code is not None:
            self.exit_code, self.timers.stop_deadline = outcome.daemon_exit_code, None
        self._publish()

    # -- control and status ---------------------------------------------------------------

    def status(self) -> StatusView:
        """The ``status --json`` object (docs/design.md, "Status")."""
        return status_view(self)

    def _publish(self) -> None:
        self.timers.state_dirty, self.timers.last_state_write = False, self.clock.monotonic()
        self.reporter.publish(self.status(), one_line(self.status()))

    # -- shutdown -------------------------------------------------------------------------

    def _daemon_failed(self, exc: BaseException) -> None:
        text = "".join(traceback.format_exception(exc))[-4000:]
        run_no = self.run.run_no if self.run else 0
        self.reporter.announce(
            run_no, Event.FATAL, "error", reason="daemon_error", error=repr(exc), traceback=text
        )
        self.state, self.exit_code = State.FATAL, EXIT_FATAL
        self.ledger.fatal_reason = "daemon_error"

    def close(self) -> None:
        """End every run's processes, wait for the pipes, close the log and the sockets.

        Never raises: each step that fails (out of descriptors, a full disk) is logged and
        the next one still runs, so the log is always flushed and closed.
        """
        run = self.run
        own = isinstance(self.ops, HostProcesses)
        self._fd_reserve.release()  # the last steps may need descriptors the job's end did not free
        steps: list[tuple[str, Callable[[], object]]] = [
            ("alerts", self.reporter.alerts.close),  # first: an alert going out is not swept
            ("sweep", lambda: self.aftermath.sweep(run, own_descendants=own)),
            ("drains", lambda: [d.wait_eof(2.0) for d in (run.drains if run is not None else ())]),
            ("gpu", self.gpu.stop),
            (
                "daemon_exit",
                lambda: self.reporter.event(
                    run.run_no if run else 0, Event.DAEMON_EXIT, state=self.state.value
                ),
            ),
            ("state", self._publish),
            ("reporter", self.reporter.close),
            ("control", lambda: self.control.close() if self.control is not None else None),
            ("notify", lambda: self.notify.close() if self.notify is not None else None),
            ("selector", self._selector.close),
            ("inbox", self.inbox.close),
            ("cgroups", self.ops.close),
        ]
        for name, step in steps:
            try:
                step()
            except Exception as exc:
                log.error("close_step_failed", step=name, error=repr(exc))
