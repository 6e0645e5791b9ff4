"""The daemon's shell: the selector loop, and what woke it turned into the model's inputs.

Each wake-up (a signal, a datagram, a deadline of the table, a thread's message) becomes an
input to :meth:`~dflashd.supervisor.core.DaemonCore.step`; the core keeps the state and
executes the effects.  Threads never call into the loop: they post to the inbox and poke
the wake pipe; signal handlers do nothing (``set_wakeup_fd``).  Death is SIGCHLD plus
``wait4`` on the child's pid, never pipe EOF.  The :class:`HostDoubles` put a test's clock,
processes, GPUs and dumps in place of the host.
"""

from __future__ import annotations

import gc
import math
import os
import random
import signal
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from dflashd.supervisor.carryover import carried_over
from dflashd.supervisor.core import DaemonCore
from dflashd.supervisor.doubles import HostDoubles, StartupError
from dflashd.supervisor.endedruns import EndedRuns
from dflashd.supervisor.foreground import say, serve_handed_over
from dflashd.supervisor.host import codecache
from dflashd.supervisor.host.clock import SystemClock
from dflashd.supervisor.host.config import Config
from dflashd.supervisor.host.groups import HostProcesses
from dflashd.supervisor.host.handover import FirstLaunch, HandoverError, take_handover
from dflashd.supervisor.host.home import Home
from dflashd.supervisor.host.notify import SystemdNotifier
from dflashd.supervisor.host.recovery import boot_id
from dflashd.supervisor.host.spawn import set_child_subreaper
from dflashd.supervisor.inbox import GpuSampled, Inbox, RunEmptied
from dflashd.supervisor.launcher import Launcher
from dflashd.supervisor.liverun import LiveRunControl, stacks_command
from dflashd.supervisor.model.bounds import MAX_SECONDS
from dflashd.supervisor.model.deadlines import Deadline, Deadlines
from dflashd.supervisor.model.effects import Publish, WriteRecord
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.exitcodes import EXIT_USAGE
from dflashd.supervisor.model.hang import HangSampled
from dflashd.supervisor.model.inputs import (
    ChildExited,
    Emptied,
    Started,
    StatusWritten,
    StopRequested,
)
from dflashd.supervisor.model.killing import STACKS_BOUND_S
from dflashd.supervisor.model.ledger import Ledger
from dflashd.supervisor.model.lifecycle import LoopState
from dflashd.supervisor.model.progress import Limits, NotifyMessage
from dflashd.supervisor.model.stacks import StacksTaken
from dflashd.supervisor.model.step import DaemonState, Rules
from dflashd.supervisor.model.verdicts import signal_name
from dflashd.supervisor.publisher import Publisher
from dflashd.supervisor.runs import LoopCallbacks, RunParts, Runs
from dflashd.supervisor.snapshot import goodput_totals, status_view
from dflashd.supervisor.speak.control import stop_handler
from dflashd.supervisor.speak.daemonlog import reopen_daemon_log
from dflashd.supervisor.speak.diagnostics import get_logger
from dflashd.supervisor.speak.reporter import MetricsUnavailable, Reporter
from dflashd.supervisor.speak.statusview import StatusView, read_state
from dflashd.supervisor.speak.wakeups import Wakeups
from dflashd.supervisor.watch.gpuwatch import GpuSettings, GpuWatch
from dflashd.supervisor.watch.linewatch import LineMatcher, LineWatcher
from dflashd.supervisor.watch.nvml import NvmlSampler
from dflashd.supervisor.watch.observe import RunObserver
from dflashd.supervisor.watch.run import Run
from dflashd.supervisor.watch.stackdumps import StackDumps

log = get_logger("dflashd")


class Daemon:
    """One supervised job in one home directory: the loop and what only the loop may do."""

    def __init__(
        self,
        home: Home,
        config: Config,
        *,
        doubles: HostDoubles | None = None,
        on_first_launch: FirstLaunch | None = None,
    ) -> None:
        doubles = doubles or HostDoubles()
        self.home, self.config = home, config
        self.clock = clock = doubles.clock or SystemClock()
        self.ops = doubles.ops or HostProcesses(home.id)
        self._sampler_factory = doubles.sampler_factory or (lambda _pid: NvmlSampler(config.gpus))
        self._opened = False  # open() finished: the start was not refused
        self.started_wall = clock.time()
        self.inbox = Inbox()
        self._systemd = SystemdNotifier.from_environ(dict(os.environ))
        c = config
        matcher = LineMatcher(c.first_step_pattern, c.step_pattern, c.builtin_formats)
        self._limits = Limits(
            c.first_step_timeout_s, c.stall_timeout_s, c.hang_suspect_s, c.remote_wait_s
        )
        self.gpu = GpuWatch(GpuSettings.from_config(config))
        self.boot_id = boot_id()
        self.reporter = Reporter(home, config, self._systemd, clock)
        emptied = lambda run_no: self.inbox.post(RunEmptied(run_no))  # noqa: E731
        self.ended_runs = EndedRuns(self.ops, self.reporter, emptied)
        self.core: DaemonCore  # made below, once the hands it acts through are
        look = lambda run, heard: self.core.step(run, heard)  # noqa: E731, PLW0108 (core: below)
        self.observer = RunObserver(self.gpu, self.ops, look)
        self.dumps = doubles.dumps or StackDumps(
            home, self.reporter, self.inbox.post, clock.monotonic
        )
        table, hang = lambda: self.core.deadlines, lambda: self.core.state.hang
        live = (self._limits, self.dumps, table, hang, look)
        self.live = LiveRunControl(clock, self.observer.stall_look, *live)
        tap = doubles.line_tap
        watcher = lambda run_no: LineWatcher(run_no, matcher, clock.monotonic, self.inbox.post, tap)  # noqa: E731
        launcher = Launcher(home, config, clock, self.ops, self.reporter, self.gpu, watcher)
        hands = (self.observer, launcher, self.live, self.ended_runs, self._systemd)
        parts = RunParts(self.ops, self.reporter, self.gpu, *hands)
        facts_of = lambda run_no: self.core.facts_of(run_no)  # noqa: E731, PLW0108 (core: below)
        written = lambda: self.core.step(self.run, StatusWritten())  # noqa: E731
        totals = lambda: goodput_totals(self)  # noqa: E731
        goodput = lambda: (self.ledger.goodput, clock.monotonic())  # noqa: E731
        self.publisher = Publisher(self.reporter, self.status, totals, goodput, written)
        publish = self.publisher.publish
        callbacks = LoopCallbacks(self._drain_inbox, publish, facts_of, on_first_launch)
        self.runs = Runs(clock, parts, callbacks)
        every = self._systemd.watchdog_interval_s
        allowed = config.gpus if isinstance(config.gpus, tuple) else None  # the pre-flight's
        rules = Rules(config.restart, config.alerts.on, every, config.vram_grace_s, allowed)
        rules = replace(rules, on_diverge=config.on_diverge)
        no_dumps = None if self.dumps.available else self.dumps.tool()
        release = (config.gpu_release_timeout_s, config.gpu_poll_s)
        rules = replace(
            rules, gpu_fallback=config.gpu_fallback, no_dumps=no_dumps, gpu_release_s=release
        )
        self.core = DaemonCore(DaemonState(rules), clock, self.reporter, self.runs)
        self.runs.current = lambda: self.core.run
        self.standby_view = launcher.standby_view  # status: the next run's waiting interpreter
        self.wakeups: Wakeups | None = None

    @property
    def loop(self) -> LoopState:
        """The loop's state (the core owns it)."""
        return self.core.loop

    @property
    def deadlines(self) -> Deadlines:
        """The deadline table (the core holds it)."""
        return self.core.deadlines

    @property
    def ledger(self) -> Ledger:
        """The counters kept between runs (the core owns them)."""
        return self.core.ledger

    hang_watch = property(lambda self: self.core.state.hang, doc="The run's hang evidence.")

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
            codecache.settle()  # start-up's dataclasses made: their kept code saved, let go
            gc.freeze()  # start-up's objects live on: a flood's garbage never walks them again
            self._loop()
        except StartupError:
            raise
        except Exception as exc:  # the last-resort guard: record, end the child, never vanish
            self.core.daemon_failed(self.run, exc)
        finally:
            self.close()
        return self.loop.exit_code

    state = property(lambda self: self.loop.state, doc="The daemon's state (a :class:`State`).")

    @property
    def run(self) -> Run | None:
        """The current (or last) run."""
        return self.core.run

    def reap(self) -> None:
        """SIGCHLD: the child's death (its facts) goes to the model (:meth:`Runs.reap`)."""
        run = self.run
        died = self.runs.reap(run)
        if died is not None:
            self.core.step(run, died)

    def request_stop(self, timeout_s: float) -> None:
        """``dflashd stop``, SIGTERM, SIGINT: SIGTERM to the run's group, SIGKILL after
        ``timeout_s`` (the config's when out of range), then exit."""
        if not math.isfinite(timeout_s) or not 0 <= timeout_s <= MAX_SECONDS:
            timeout_s = self.config.restart.stop_timeout_s
        run = self.run
        self.core.step(run, StopRequested(timeout_s, run is not None and run.alive))

    def open(self) -> None:
        """Everything before the loop: history, sockets, recovery, GPUs, metrics, the first launch."""
        self.reporter.open_history()
        stop_s = self.config.restart.stop_timeout_s
        stop = stop_handler(stop_s, self.request_stop, lambda: self.run, STACKS_BOUND_S)
        handlers = {
            "status": lambda _: self._status_shown(),
            "stop": stop,
            "stacks": lambda req: stacks_command(self.dumps, self.core, self.run, req),
        }
        self.wakeups = Wakeups(
            self.home, self.clock, self.inbox.read_fd, handlers, self.reporter.home_dir.fd
        )
        previous = read_state(self.home.state_file, self.reporter.home_dir.fd) or {}
        carried = carried_over(
            previous,
            reporter=self.reporter,
            ops=self.ops,
            clock=self.clock,
            home=self.home,
            boot_id=self.boot_id,
            stop_s=self.config.restart.stop_timeout_s,
        )
        self.core.step(None, carried)
        if carried.lost is not None:  # a run the dead daemon never saw end: concluded as any other
            lost = ChildExited(carried.lost, random.random(), publish=False)
            self.core.step(None, lost, run_no=carried.lost.run_no)
        child_pid = lambda: self.run.pid if self.run else None  # noqa: E731
        gpus_off = self.gpu.begin(
            self.config.gpus_enabled, self._sampler_factory, child_pid, self.inbox.post_gpu
        )
        try:
            self.reporter.start_metrics(self.inbox.ping)  # before launch: a busy address refuses
        except MetricsUnavailable as exc:
            raise StartupError(str(exc)) from None
        self.runs.launcher.left_run = int(previous.get("run") or 0)  # counted past, then...
        self.core.execute(self.run, (Publish(),))  # ...state.json before the launch (never none)
        self.core.step(None, Started(gpus_off, bool(self._systemd.watchdog_interval_s)))
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
                current, alive = (run.run_no, run.alive) if run is not None else (None, False)
                self.core.step(run, Emptied(message.run_no, current, alive))
            elif isinstance(message, StacksTaken):
                self.live.taken(self.run, message)
            elif isinstance(message, HangSampled):
                self.live.hang_sampled(self.run, message)
            elif isinstance(message, GpuSampled):
                self.observer.gpu_sample(self.run, message.sample, now)
                self.core.changed()
            elif self.observer.lines(self.run, message, now):
                self.core.changed()

    def _loop(self) -> None:
        assert self.wakeups is not None
        while not self.loop.done:
            wake = self.wakeups.wait(self.next_timeout())
            self._heard(wake.said)  # before a SIGCHLD: a datagram was sent before the death
            if wake.woken:
                self._on_wake()
            self.turn()

    def _heard(self, said: list[NotifyMessage]) -> None:
        for msg in said:
            if self.observer.datagram(self.run, msg, self.clock.monotonic()):
                self.core.changed()

    def _drain_inbox(self) -> None:
        """Before a verdict: the datagrams still waiting on notify.sock, then the inbox."""
        if self.wakeups is not None:
            self._heard(self.wakeups.notify.receive())
        self._process_inbox()

    def next_timeout(self) -> float | None:
        """How long the selector may sleep: None when nothing is due (no periodic wake-ups)."""
        expiry = self.wakeups.next_expiry() if self.wakeups is not None else None
        run = self.run
        stall = step_due = None
        if run is not None and run.alive:
            step_due = run.watcher.due() if run.watcher is not None else None  # a pending step
            facts = run.facts
            stall = None if facts.ended_by_us else facts.progress.stall_deadline(self._limits)
        return self.deadlines.next_timeout(self.clock.monotonic(), expiry, step_due, stall)

    def _on_wake(self) -> None:
        run = self.run  # a death by a stop signal dflashd did not send waits for its stop
        child = run.pid if run is not None and run.alive and not run.facts.ended_by_us else None
        for signum in self.inbox.stop_first(self.inbox.signals(), child):
            if signum == signal.SIGCHLD:
                self.reap()
            elif signum in self.inbox.stop_signals:  # TERM; INT, QUIT unless begun ignored
                self.request_stop(self.config.restart.stop_timeout_s)
            elif signum in (signal.SIGHUP, signal.SIGUSR1):
                self.reopen(signal_name(signum))
            else:  # USR2, timers, IO, PWR, XCPU, real-time, an INT or QUIT begun ignored: noted
                log.info("signal_ignored", signal=signal_name(signum))

    def reopen(self, why: str) -> None:
        """SIGHUP/SIGUSR1: re-open what an admin may have moved, and dump the status.

        The control socket is bound again if its file was removed, daemon.log is re-opened
        if it was rotated away, and the status goes to daemon.log, as one record.
        """
        if self.wakeups is not None:
            self.wakeups.reopen()
        reopen_daemon_log()
        log.info("status_dump", signal=why, **dict(self.status()))

    def _on_timers(self) -> None:
        now = self.clock.monotonic()
        run = self.run
        core = self.core
        core.due(Deadline.WATCHDOG)
        watcher = run.watcher if run is not None and run.alive else None
        if watcher is not None and watcher.flush_if_due(now):
            self._process_inbox()  # a step printed, then quiet: counted now
        self.live.check(run, now)
        for deadline in (Deadline.STOP, Deadline.RESTART, Deadline.RELEASE_CHECK):
            core.due(deadline)
        if core.deadlines.state_write_due(now):
            core.execute(run, (Publish(),))

    def status(self) -> StatusView:
        """The ``status --json`` object (docs/design.md, "Status")."""
        return status_view(self)

    def _status_shown(self) -> dict[str, Any]:
        """``status`` for a client, published and saved as shown: no total shown goes back."""
        self.core.execute(self.run, (Publish(shown=True),))
        return dict(self.publisher.last_view or self.status())

    def close(self) -> None:
        """End every run's processes, wait for the pipes, close the log and the sockets.

        Never raises: each step that fails (out of descriptors, a full disk) is logged and
        the next one still runs, so the log is always flushed and closed.
        """
        self.runs.fd_reserve.release()  # the last steps may need descriptors the job's end did not free
        for name, step in _closing_steps(self):
            try:
                step()
            except Exception as exc:
                log.error("close_step_failed", step=name, error=repr(exc))


def _closing_steps(daemon: Daemon) -> list[tuple[str, Callable[[], object]]]:
    """What closing does, in order, each step on its own (:meth:`Daemon.close`)."""
    run = daemon.run
    own = isinstance(daemon.ops, HostProcesses)
    return [
        ("alerts", daemon.reporter.alerts.close),  # first: an alert going out is not swept
        ("sweep", lambda: daemon.ended_runs.sweep(run, own_descendants=own)),
        ("standby", daemon.runs.launcher.discard_standby),
        ("drains", lambda: [d.wait_eof(2.0) for d in (run.drains if run is not None else ())]),
        ("gpu", daemon.gpu.stop),
        (
            "daemon_exit",
            lambda: daemon.core.execute(
                run, (WriteRecord(Event.DAEMON_EXIT, {"state": daemon.state.value}),)
            ),
        ),
        # the last status and goodput totals; a refused start leaves status as it was (no
        # phantom "starting" state)
        (
            "state",
            lambda: daemon.core.execute(run, (Publish(final=True),)) if daemon._opened else None,
        ),
        ("reporter", daemon.reporter.close),
        ("wakeups", lambda: daemon.wakeups.close() if daemon.wakeups is not None else None),
        ("inbox", daemon.inbox.close),
        ("cgroups", daemon.ops.close),
    ]


def main() -> int:
    """``python -m dflashd.supervisor.daemon --handover-fd N …``: what ``dflashd start`` execs."""
    try:
        handover = take_handover(sys.argv[1:])
    except HandoverError as exc:
        say(str(exc))
        return EXIT_USAGE
    return serve_handed_over(handover, Daemon)


if __name__ == "__main__":
    sys.exit(main())
