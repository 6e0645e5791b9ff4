"""The daemon: one loop that owns time and wires the mechanisms to the pure decisions.

Threads: one drain per child pipe, the log writer, the GPU poller and the alert worker.
They never call into the loop; they post to ``self._inbox`` and poke the wake pipe.
Signal handlers do nothing at all: ``signal.set_wakeup_fd`` writes the signal number to
the same wake pipe, and the loop does the work (STYLE §4).  Death detection is SIGCHLD
plus ``waitpid`` on the child's pid, never pipe EOF.
"""

from __future__ import annotations

import os
import queue
import random
import re
import selectors
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import psutil

from dflashd.logs.framer import Frame
from dflashd.logs.pump import PipeDrain
from dflashd.logs.sink import LogSink
from dflashd.logs.writer import RotatingLogWriter
from dflashd.supervisor import __version__
from dflashd.supervisor.alerts import AlertDispatcher, AlertOutcome, alert_decision, alert_payload
from dflashd.supervisor.caches import clear_owned_cache
from dflashd.supervisor.config import Config, config_to_dict
from dflashd.supervisor.control import ControlServer
from dflashd.supervisor.gpu import (
    ChildGpuUse,
    GpuPoller,
    GpuSample,
    GpuSampler,
    GpuUnavailable,
    NvmlSampler,
    ScriptedSampler,
    gpu_pids_of_run,
    join_with_tree,
    reading_to_dict,
)
from dflashd.supervisor.history import RunHistory, open_history
from dflashd.supervisor.home import Home
from dflashd.supervisor.launch import (
    ChildEnvironment,
    Launched,
    child_environ,
    dflashd_env,
    group_alive,
    set_child_subreaper,
    signal_group,
    spawn,
)
from dflashd.supervisor.lifecycle import Phase, State, transition
from dflashd.supervisor.logging import get_logger
from dflashd.supervisor.notify import NotifyMessage, NotifyServer, SystemdNotifier
from dflashd.supervisor.policy import Action, RestartHistory, decide
from dflashd.supervisor.statefile import read_state, write_state
from dflashd.supervisor.verdicts import EndedBy, Observations, Verdict, classify, signal_name

log = get_logger("dflashd")

EXIT_FATAL: Final = 4  # the daemon gave up (fatal); systemd's RestartPreventExitStatus names it
_STATE_WRITE_MIN_S: Final = 1.0
_DUMP_GRACE_S: Final = 3.0
_CATCH_UP_S: Final = 0.25
_GPU_RECORD_EVERY_S: Final = 60.0
_GPU_RECORD_CHANGE_MIB: Final = 1024.0
_TAIL_LINES: Final = 20
_PROGRESS_RECORD_EVERY_S: Final = 30.0
_WAKE: Final = b"\x00"


@dataclass
class RunContext:
    """Everything about the current (or last) child."""

    number: int
    argv: tuple[str, ...]
    started_mono: float
    started_wall: float
    launched: Launched | None = None
    drains: list[PipeDrain] = field(default_factory=list)
    first_step_mono: float | None = None
    last_progress_mono: float | None = None
    step: int | None = None
    status_text: str | None = None
    extend_until_mono: float | None = None
    ended_by: EndedBy = EndedBy.CHILD
    kill_at_mono: float | None = None
    alerted: set[str] = field(default_factory=set)
    gpu_baseline_mib: dict[int, float] = field(default_factory=dict)
    gpu_use: ChildGpuUse | None = None
    gpu_xids: list[int] = field(default_factory=list)
    pids_seen: set[int] = field(default_factory=set)
    reports_steps: bool = False
    last_progress_record_mono: float = 0.0

    @property
    def pid(self) -> int | None:
        return self.launched.pid if self.launched is not None else None


class Daemon:
    """One supervised job in one home directory."""

    def __init__(
        self,
        home: Home,
        config: Config,
        *,
        on_first_launch: Callable[[dict[str, Any]], None] | None = None,
        sampler_factory: Callable[[], GpuSampler] | None = None,
    ) -> None:
        self.home = home
        self.config = config
        self._on_first_launch = on_first_launch
        self._sampler_factory = sampler_factory
        self.state = State.STARTING
        self.phase = Phase.LAUNCHING
        self.run: RunContext | None = None
        self.history = RestartHistory()
        self.restarts_by_verdict: dict[str, int] = {}
        self.last_exit: dict[str, Any] | None = None
        self.restart_at_mono: float | None = None
        self.pending_clear_cache = False
        self.exit_code = 0
        self.started_wall = time.time()
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._stop_requested = False
        self._stop_deadline_mono: float | None = None
        self._state_dirty_since: float | None = None
        self._last_state_write = 0.0
        self._rng = random.Random()
        self._systemd = SystemdNotifier.from_environ(dict(os.environ))
        self._next_watchdog_mono: float | None = None
        self._first_step_re = (
            re.compile(config.first_step_pattern, re.M) if config.first_step_pattern else None
        )
        self._step_re = re.compile(config.step_pattern, re.M) if config.step_pattern else None
        self._gpu: GpuPoller | None = None
        self._gpu_status = "off"
        self._gpu_last: tuple[dict[str, Any], ...] = ()
        self._gpu_last_record_mono = 0.0
        self._gpu_last_record_total = 0.0
        self._history_db: RunHistory | None = None
        self._ended_groups: list[int] = []
        self._gpu_sample: GpuSample | None = None
        self._release_wait_since: float | None = None
        self._foreign_reported = False

        self.writer = RotatingLogWriter(
            home.logs, max_bytes=config.logs.max_bytes, backups=config.logs.backups
        )
        self.sink = LogSink(self.writer)
        self.alerts = AlertDispatcher(
            config.alerts.command, self._alert_done, config.alerts.webhook_url
        )
        self._recovering_from: str | None = None
        self._snapshot: dict[str, Any] = {}
        self._metrics: Any = None
        self._alerts_sent = 0

    # -- public entry -------------------------------------------------------------------

    def serve(self) -> int:
        """Run until stopped, completed or fatal; returns the process exit code."""
        self._install_signals()
        set_child_subreaper()
        self._history_db = open_history(self.home.runs_db)
        self.control = ControlServer(self.home.control_socket)
        self.notify = NotifyServer(self.home.notify_socket)
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._selector.register(self.notify.fileno(), selectors.EVENT_READ, "notify")
        self._selector.register(self.control.sock, selectors.EVENT_READ, "control")
        self._recover_previous()
        if self.writer.torn_bytes:
            self._event(self.writer.last_run, "log_torn_tail", bytes=self.writer.torn_bytes)
        self._start_gpu()
        self._start_metrics()
        if self._systemd.watchdog_interval_s:
            self._next_watchdog_mono = time.monotonic()
        self._launch()
        if self._gpu is not None:
            self._gpu.start()  # after the launch: the first poll already sees the child
        try:
            self._loop()
        finally:
            self._shutdown()
        return self.exit_code

    # -- setup --------------------------------------------------------------------------

    def _install_signals(self) -> None:
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, _no_op_handler)

    def _recover_previous(self) -> None:
        """A previous daemon died without cleaning up: end the child it left (recorded in state.json)."""
        previous = read_state(self.home.state_file) or {}
        self.restarts_by_verdict = dict(previous.get("restarts_by_verdict") or {})
        if previous.get("state") == "fatal":
            self._recovering_from = "fatal"
        child = previous.get("child")
        if not isinstance(child, dict) or not child.get("pid"):
            return
        pid = int(child["pid"])
        created = child.get("create_time")
        try:
            proc = psutil.Process(pid)
            same = created is None or abs(proc.create_time() - float(created)) < 1.0
        except psutil.Error:
            same = False
        if not same and not group_alive(pid):
            return
        # Only processes at least as young as the recorded child: a reused pgid is not ours.
        born = float(created) - 1.0 if created is not None else 0.0
        survivors = {p for p in _group_members(pid) if _create_time(p) >= born}
        if not survivors:
            return
        run = int(previous.get("run") or 0)
        self._event(run, "recovered_orphan", pgid=pid, pids=sorted(survivors))
        log.warning("previous_child_still_running", pgid=pid, pids=sorted(survivors))
        _terminate_group(pid, self.config.restart.stop_timeout_s)

    def _start_metrics(self) -> None:
        if not self.config.metrics_listen:
            return
        from dflashd.supervisor.metrics import MetricsServer

        def extra() -> dict[str, float]:
            stats = self.sink.stats()
            return {
                "log_written_bytes": float(stats.writer.bytes_written),
                "log_dropped_bytes": float(stats.writer.bytes_dropped + stats.stalled_drops_bytes),
                "alerts": float(self._alerts_sent),
            }

        server = MetricsServer(self.config.metrics_listen, lambda: self._snapshot, extra)
        try:
            server.start()
        except OSError as exc:
            self._event(0, "metrics_off", listen=self.config.metrics_listen, error=str(exc))
            log.error("metrics_off", listen=self.config.metrics_listen, error=str(exc))
            return
        self._metrics = server
        self._event(0, "metrics_on", listen=f"{server.host}:{server.port}")

    def _start_gpu(self) -> None:
        if not self.config.gpus_enabled:
            self._gpu_status = 'off (gpus = "none")'
            self._event(0, "gpu_checks_off", reason='gpus = "none" in the config')
            return
        try:
            sampler = self._sampler_factory() if self._sampler_factory else _default_sampler(self)
        except GpuUnavailable as exc:
            self._gpu_status = f"off ({exc})"
            self._event(0, "gpu_checks_off", reason=str(exc))
            log.info("gpu_checks_off", reason=str(exc))
            return
        self._gpu_status = f"on ({sampler.name})"
        # A reading before the first launch: the baseline that container pid-namespace fallback compares with.
        try:
            first = sampler.sample()
            self._gpu_last = tuple(reading_to_dict(r, None) for r in first)
        except Exception as exc:
            log.warning("gpu_baseline_failed", error=str(exc))
        self._gpu = GpuPoller(sampler, self.config.gpu_poll_s, lambda s: self._post("gpu", s))

    # -- the loop -----------------------------------------------------------------------

    def _post(self, kind: str, payload: Any) -> None:
        """From any thread: queue work for the loop and wake it."""
        self._inbox.put((kind, payload))
        try:
            os.write(self._wake_w, _WAKE)
        except BlockingIOError:
            pass  # the pipe is full, so the loop is awake anyway

    def _loop(self) -> None:
        while self.state not in (State.STOPPED, State.FATAL):
            timeout = self._next_timeout()
            for key, _ in self._selector.select(timeout):
                if key.data == "wake":
                    self._on_wake()
                elif key.data == "notify":
                    for msg in self.notify.receive():
                        self._on_notify(msg)
                elif key.data == "control":
                    conn = self.control.accept()
                    if conn is not None:
                        self._selector.register(conn, selectors.EVENT_READ, "conn")
                elif key.data == "conn":
                    self._on_control(key.fileobj)
            self._drain_inbox()
            self._on_timers()

    def _next_timeout(self) -> float | None:
        now = time.monotonic()
        deadlines = [d for d in self._deadlines() if d is not None]
        if not deadlines:
            return None  # nothing due: sleep until an event (no periodic wake-ups)
        return max(0.0, min(deadlines) - now)

    def _deadlines(self) -> list[float | None]:
        run = self.run
        out: list[float | None] = [
            self.restart_at_mono,
            self._stop_deadline_mono,
            self._next_watchdog_mono,
        ]
        if self._state_dirty_since is not None:
            out.append(self._last_state_write + _STATE_WRITE_MIN_S)
        if run is not None and run.launched is not None and self.phase is not Phase.EXITED:
            out.append(run.kill_at_mono)
            out.append(self._stall_deadline(run))
        return out

    def _stall_deadline(self, run: RunContext) -> float | None:
        if run.ended_by is not EndedBy.CHILD:
            return None
        if run.first_step_mono is None:
            deadline = run.started_mono + self.config.first_step_timeout_s
            if run.extend_until_mono is not None:
                deadline = max(deadline, run.extend_until_mono)
            return deadline
        last = run.last_progress_mono or run.first_step_mono
        return last + self.config.stall_timeout_s

    def _on_wake(self) -> None:
        try:
            data = os.read(self._wake_r, 4096)
        except BlockingIOError:
            return
        for signum in set(data):
            if signum == signal.SIGCHLD:
                self._reap()
            elif signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                self.request_stop(self.config.restart.stop_timeout_s)

    def _drain_inbox(self) -> None:
        while True:
            try:
                kind, payload = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "progress":
                run_no, step, first = payload
                if self.run is not None and self.run.number == run_no:
                    self._progress(step=step, first=first, source="pattern")
            elif kind == "output":
                run = self.run
                # Output is progress only for a child that reports no steps of its own.
                if run is not None and run.number == payload and not run.reports_steps:
                    self._progress(step=None, first=False, source="output")
            elif kind == "gpu":
                self._on_gpu(payload)

    def _on_timers(self) -> None:
        now = time.monotonic()
        run = self.run
        if self._next_watchdog_mono is not None and now >= self._next_watchdog_mono:
            self._systemd.notify("WATCHDOG=1")
            self._next_watchdog_mono = now + (self._systemd.watchdog_interval_s or 1.0)
        if run is not None and run.launched is not None and self.phase is not Phase.EXITED:
            if run.kill_at_mono is not None and now >= run.kill_at_mono:
                run.kill_at_mono = None
                signal_group(run.launched.pid, signal.SIGKILL)
            stall = self._stall_deadline(run)
            if stall is not None and now >= stall:
                reason = (
                    EndedBy.STALL_FIRST_STEP
                    if run.first_step_mono is None
                    else EndedBy.STALL_PROGRESS
                )
                self._end_run(reason)
        if self._stop_deadline_mono is not None and now >= self._stop_deadline_mono:
            self._stop_deadline_mono = None
            if run is not None and run.launched is not None:
                self._event(run.number, "stop_timeout", signal="SIGKILL")
                signal_group(run.launched.pid, signal.SIGKILL)
        if self.restart_at_mono is not None and now >= self.restart_at_mono:
            self.restart_at_mono = None
            if self._gpu_memory_released(now):
                self._launch()
        if (
            self._state_dirty_since is not None
            and now >= self._last_state_write + _STATE_WRITE_MIN_S
        ):
            self._write_state()

    # -- launching ----------------------------------------------------------------------

    def _next_run_number(self) -> int:
        known = [self.writer.last_run, self.run.number if self.run else 0]
        if self._history_db is not None:
            known.append(self._history_db.last_run())
        previous = read_state(self.home.state_file) or {}
        known.append(int(previous.get("run") or 0))
        return max(known) + 1

    def _launch(self) -> None:
        if self.state is not State.STARTING:
            self.state = transition(self.state, State.STARTING)
        self.phase = Phase.LAUNCHING
        number = self._next_run_number()
        cwd = Path(self.config.cwd).expanduser()
        spec = ChildEnvironment(self.home.notify_socket, self.home.cache, number, self.home.root)
        env_keys = sorted(dflashd_env(spec))
        run = RunContext(number, self.config.command, time.monotonic(), time.time())
        run.reports_steps = self._step_re is not None
        self._foreign_reported = False
        self.run = run
        if self.pending_clear_cache:
            self.pending_clear_cache = False
            try:
                cleared = clear_owned_cache(self.home.cache, self.home.root)
            except (OSError, ValueError) as exc:
                cleared = False
                log.warning("cache_clear_failed", error=str(exc))
            self._event(number, "cache_cleared", path=str(self.home.cache), cleared=cleared)
        run.gpu_baseline_mib = self._gpu_baseline()
        ticket = self.sink.submit_event(
            number,
            "spawn",
            {
                "argv": list(run.argv),
                "cwd": str(cwd),
                "env_keys": env_keys,
                "config_env_keys": sorted(self.config.env),
                "dflashd_version": __version__,
            },
        )
        # Log before launch: the spawn record is on disk before the fork, so the log exists
        # and says what was attempted even if the child never runs a single instruction.
        self.sink.wait_written(ticket, 2.0)
        env = child_environ(os.environ, self.config.env, spec)
        try:
            launched = spawn(run.argv, cwd=cwd, env=env)
        except OSError as exc:
            self._spawn_failed(run, exc)
            return
        run.launched = launched
        run.pids_seen.add(launched.pid)
        try:
            create_time: float | None = psutil.Process(launched.pid).create_time()
        except psutil.Error:
            create_time = None
        self._child_create_time = create_time
        self._event(number, "launched", pid=launched.pid, pgid=launched.pid)
        callback = self._lines_callback(number)
        run.drains = [
            PipeDrain(
                fd,
                run=number,
                src=src,
                sink=self.sink,
                max_line_bytes=self.config.logs.max_line_bytes,
                tail_lines=_TAIL_LINES,
                on_lines=callback,
            )
            for fd, src in ((launched.stdout_fd, "stdout"), (launched.stderr_fd, "stderr"))
        ]
        self.state = transition(self.state, State.RUNNING)
        self.phase = Phase.WARMING_UP
        if self._history_db is not None:
            self._history_db.started(number, run.started_wall, launched.pid, " ".join(run.argv))
        log.info("launched", run=number, pid=launched.pid, argv=list(run.argv))
        self._write_state()
        self._announce_first_launch({"ok": True, "run": number, "pid": launched.pid})
        self._systemd.notify(f"READY=1\nSTATUS={self._one_line_status()}")

    def _spawn_failed(self, run: RunContext, exc: OSError) -> None:
        error = f"{exc.strerror or exc}: {run.argv[0]}"
        if isinstance(exc, FileNotFoundError) and exc.filename and str(exc.filename) != run.argv[0]:
            error = f"{exc.strerror}: {exc.filename}"
        log.error("spawn_failed", run=run.number, error=error)
        if self._history_db is not None:
            self._history_db.started(run.number, run.started_wall, None, " ".join(run.argv))
        obs = Observations(spawn_error=error)
        self._finish_run(run, obs, duration_s=0.0)
        self._announce_first_launch(
            {"ok": False, "run": run.number, "error": f"spawn failed: {error}"}
        )

    def _announce_first_launch(self, info: dict[str, Any]) -> None:
        if self._on_first_launch is not None:
            callback, self._on_first_launch = self._on_first_launch, None
            info.update({"log": str(self.writer.path), "daemon_pid": os.getpid()})
            callback(info)

    def _lines_callback(self, number: int) -> Callable[[str, Frame], None]:
        first_re, step_re = self._first_step_re, self._step_re
        last_post = [0.0]

        def on_lines(_src: str, frame: Frame) -> None:
            # Runs on a drain thread: one regex pass over the whole frame, then a post to the loop.
            step: int | None = None
            first = False
            if first_re is not None or step_re is not None:
                text = "\n".join(frame.lines)
                if step_re is not None:
                    matches = step_re.findall(text)
                    if matches:
                        last = matches[-1]
                        step = _to_int(last[0] if isinstance(last, tuple) else last)
                        first = step is not None
                if first_re is not None and first_re.search(text):
                    first = True
            if first or step is not None:
                self._post("progress", (number, step, first))
                return
            now = time.monotonic()
            if now - last_post[0] >= 1.0:  # output as liveness, at most once a second
                last_post[0] = now
                self._post("output", number)

        return on_lines

    # -- progress -----------------------------------------------------------------------

    def _on_notify(self, msg: NotifyMessage) -> None:
        run = self.run
        if run is None or run.launched is None or self.phase is Phase.EXITED:
            return
        if msg.sender_pid is not None and not self._in_child_tree(msg.sender_pid, run):
            return  # a leftover of an earlier run, or a stranger: not this run's progress
        if msg.status is not None:
            run.status_text = msg.status
            self._event(run.number, "child_status", status=msg.status)
        if msg.extend_timeout_us is not None and run.first_step_mono is None:
            run.extend_until_mono = time.monotonic() + msg.extend_timeout_us / 1e6
        if msg.step is not None or msg.watchdog:
            run.reports_steps = True
        if msg.is_progress:
            self._progress(step=msg.step, first=msg.ready or msg.step is not None, source="notify")
        self._mark_dirty()

    def _in_child_tree(self, pid: int, run: RunContext) -> bool:
        if pid in run.pids_seen:
            return True
        try:
            pgid = os.getpgid(pid)
        except OSError:
            return False
        if run.launched is not None and pgid == run.launched.pid:
            run.pids_seen.add(pid)
            return True
        return False

    def _progress(self, *, step: int | None, first: bool, source: str) -> None:
        run = self.run
        if run is None or self.phase is Phase.EXITED:
            return
        now = time.monotonic()
        if step is not None:
            run.step = step
        if first and run.first_step_mono is None:
            run.first_step_mono = now
            self.phase = Phase.TRAINING
            self._event(
                run.number,
                "first_step",
                after_s=round(now - run.started_mono, 3),
                step=run.step,
                source=source,
            )
            if self._recovering_from is not None:
                # Training resumed after a fatal or a stall: say so, once.
                self._maybe_alert(run, "recovered", self._recovering_from, {"tail": []}, 0)
                self._recovering_from = None
            self._write_state()
        elif run.first_step_mono is not None:
            self.phase = Phase.TRAINING
        if run.first_step_mono is not None or first:
            run.last_progress_mono = now
        if (
            step is not None
            and run.first_step_mono is not None
            and now - run.last_progress_record_mono >= _PROGRESS_RECORD_EVERY_S
        ):
            run.last_progress_record_mono = (
                now  # steps over time for `dflashd report`, rate-limited
            )
            self._event(run.number, "progress", step=step)
        self._mark_dirty()

    # -- GPU ----------------------------------------------------------------------------

    def _gpu_baseline(self) -> dict[int, float]:
        return {int(g["index"]): float(g.get("memory_used_mib") or 0.0) for g in self._gpu_last}

    def _on_gpu(self, sample: GpuSample) -> None:
        self._gpu_sample = sample
        run = self.run
        tree: set[int] = set()
        if run is not None and run.launched is not None and self.phase is not Phase.EXITED:
            tree = gpu_pids_of_run(sample.readings, run.launched.pid, run.pids_seen)
            run.pids_seen |= tree
        use = join_with_tree(sample.readings, tree, run.gpu_baseline_mib if run else {})
        entries = tuple(
            reading_to_dict(r, use.per_gpu_mib.get(r.index) if tree else None)
            for r in sample.readings
        )
        self._gpu_last = entries
        xids = [x for r in sample.readings for x in r.xids]
        if run is not None and tree:
            run.gpu_use = use
            if xids:
                run.gpu_xids.extend(xids)
                self._event(run.number, "gpu_xid", xids=xids, gpus=list(entries))
        total = sum(float(e.get("memory_used_mib") or 0.0) for e in entries)
        now = time.monotonic()
        if (
            now - self._gpu_last_record_mono >= _GPU_RECORD_EVERY_S
            or abs(total - self._gpu_last_record_total) >= _GPU_RECORD_CHANGE_MIB
        ):
            self._gpu_last_record_mono = now
            self._gpu_last_record_total = total
            self._event(
                run.number if run else 0,
                "gpu",
                gpus=list(entries),
                method=use.method,
                poll_ms=round(sample.cost_s * 1000, 3),
            )
        self._check_no_gpu_memory(run, use, now)

    def _gpu_memory_released(self, now: float) -> bool:
        """Before a relaunch: the dead run's processes must hold no GPU memory (up to a timeout).

        Holders from the dead run (its process group or a recorded descendant) are killed; a
        foreign holder is named, never touched.  Returns False to postpone the launch.
        """
        run, sample = self.run, self._gpu_sample
        if self._gpu is None or run is None or sample is None or run.launched is None:
            return True
        ours: list[dict[str, Any]] = []
        foreign: list[dict[str, Any]] = []
        for reading in sample.readings:
            for proc in reading.processes:
                if proc.used_mib is not None and proc.used_mib <= 0:
                    continue
                entry: dict[str, Any] = {
                    "gpu": reading.index,
                    "pid": proc.pid,
                    "mib": proc.used_mib,
                    "cmd": _cmdline(proc.pid),
                }
                belongs = proc.pid in run.pids_seen or _pgid(proc.pid) == run.launched.pid
                (ours if belongs else foreign).append(entry)
        if foreign and not self._foreign_reported:
            self._foreign_reported = True
            self._event(run.number, "gpu_foreign_holder", holders=foreign)
        if not ours:
            if self._release_wait_since is not None:
                self._event(
                    run.number,
                    "gpu_memory_released",
                    waited_s=round(now - self._release_wait_since, 3),
                )
            self._release_wait_since = None
            return True
        if self._release_wait_since is None:
            self._release_wait_since = now
            self._event(run.number, "gpu_memory_held", holders=ours)
            log.warning("gpu_memory_held", holders=ours)
            for entry in ours:
                try:
                    os.kill(entry["pid"], signal.SIGKILL)  # a leftover of the run we started
                except (ProcessLookupError, PermissionError):
                    pass
        if now - self._release_wait_since >= self.config.gpu_release_timeout_s:
            self._event(
                run.number,
                "gpu_release_timeout",
                holders=ours,
                waited_s=round(now - self._release_wait_since, 3),
            )
            self._release_wait_since = None
            return True
        self.restart_at_mono = now + self.config.gpu_poll_s  # look again after the next poll
        return False

    def _check_no_gpu_memory(self, run: RunContext | None, use: ChildGpuUse, now: float) -> None:
        if run is None or run.launched is None or self.phase is Phase.EXITED:
            return
        if run.first_step_mono is not None or run.ended_by is not EndedBy.CHILD:
            return
        if now - run.started_mono < self.config.vram_grace_s:
            return
        total = use.total_mib
        if total is None or total > 0:
            return  # unknown is not zero; memory held means it is doing something
        self._event(run.number, "gpu_snapshot", gpus=list(self._gpu_last), method=use.method)
        self._end_run(EndedBy.NO_GPU_MEMORY)

    # -- ending a run -------------------------------------------------------------------

    def _end_run(self, why: EndedBy) -> None:
        """We end the run (stall, no GPU memory): ask for a stack dump, then kill the group."""
        run = self.run
        if run is None or run.launched is None or run.ended_by is not EndedBy.CHILD:
            return
        run.ended_by = why
        pid = run.launched.pid
        self._event(run.number, "ending_run", why=why.value, signal="SIGABRT", then="SIGKILL")
        log.warning("ending_run", run=run.number, why=why.value)
        # PYTHONFAULTHANDLER=1 makes a Python child print every thread's stack on SIGABRT, into the log.
        try:
            os.kill(pid, signal.SIGABRT)
        except ProcessLookupError:
            pass
        run.kill_at_mono = time.monotonic() + _DUMP_GRACE_S

    def request_stop(self, timeout_s: float) -> None:
        """Stop: SIGTERM to the child's group, SIGKILL after ``timeout_s``, then exit."""
        if self._stop_requested:
            return
        self._stop_requested = True
        self.restart_at_mono = None
        run = self.run
        child_running = (
            run is not None and run.launched is not None and self.phase is not Phase.EXITED
        )
        if self.state not in (State.STOPPING, State.STOPPED):
            self.state = transition(self.state, State.STOPPING)
        self._systemd.notify("STOPPING=1")
        if child_running and run is not None and run.launched is not None:
            if run.ended_by is EndedBy.CHILD:
                run.ended_by = EndedBy.STOP
            self._event(run.number, "stopping", signal="SIGTERM", timeout_s=timeout_s)
            signal_group(run.launched.pid, signal.SIGTERM)
            self._stop_deadline_mono = time.monotonic() + timeout_s
        else:
            self._finish_stop()
        self._write_state()

    def _reap(self) -> None:
        run = self.run
        if run is not None and run.launched is not None and self.phase is not Phase.EXITED:
            try:
                pid, status = os.waitpid(run.launched.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = run.launched.pid, 0
            if pid == run.launched.pid:
                run.launched.process.returncode = os.waitstatus_to_exitcode(status)
                self._child_died(run, status)
        self._reap_orphans()

    def _reap_orphans(self) -> None:
        """As subreaper, orphaned grandchildren are ours: reap the zombies (never the alert commands)."""
        try:
            children = psutil.Process().children()
        except psutil.Error:
            return
        live = self.run.pid if self.run is not None and self.phase is not Phase.EXITED else None
        for child in children:
            if child.pid == live or child.pid in self.alerts.pids:
                continue
            try:
                if child.status() == psutil.STATUS_ZOMBIE:
                    os.waitpid(child.pid, os.WNOHANG)
            except (psutil.Error, ChildProcessError):
                continue

    def _child_died(self, run: RunContext, status: int) -> None:
        died_mono = time.monotonic()
        self.phase = Phase.EXITED
        # Everything the child wrote is already in the pipes: frame it before the exit record.
        for drain in run.drains:
            drain.catch_up(_CATCH_UP_S)
        exit_code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
        signum = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        stderr = next((d for d in run.drains if d.src == "stderr"), None)
        stdout = next((d for d in run.drains if d.src == "stdout"), None)
        stderr_tail = tuple(stderr.tail) if stderr is not None else ()
        output_lines = sum(d.line_count for d in run.drains)
        obs = Observations(
            exit_code=exit_code,
            signal=signum,
            ended_by=run.ended_by,
            reached_first_step=run.first_step_mono is not None,
            output_lines=output_lines,
            stderr_tail=stderr_tail,
            gpu_xids=tuple(run.gpu_xids),
        )
        tail = list(stderr_tail) if stderr_tail else list(stdout.tail if stdout is not None else ())
        self._finish_run(run, obs, duration_s=died_mono - run.started_mono, tail=tail)
        # Scanning processes is only needed when the group still has members (one cheap killpg probe).
        leftovers: set[int] = set()
        if run.launched is not None and group_alive(run.launched.pid):
            leftovers = _group_members(run.launched.pid)
        if run.ended_by is not EndedBy.CHILD and run.launched is not None:
            # We ended this run: nothing of it may live on.
            signal_group(run.launched.pid, signal.SIGKILL)
        elif leftovers:
            self._event(
                run.number,
                "leftover_processes",
                pgid=run.launched.pid if run.launched else None,
                pids=sorted(leftovers),
            )
        if run.launched is not None:
            self._ended_groups.append(run.launched.pid)

    def _finish_run(
        self,
        run: RunContext,
        obs: Observations,
        *,
        duration_s: float,
        tail: list[str] | None = None,
    ) -> None:
        self.phase = Phase.EXITED
        result = classify(obs)
        now_mono = time.monotonic()
        progress_s = 0.0
        if run.first_step_mono is not None:
            progress_s = (run.last_progress_mono or run.first_step_mono) - run.first_step_mono
        tail = tail or []
        signame = signal_name(obs.signal) if obs.signal is not None else None
        exit_fields: dict[str, Any] = {
            "exit_code": obs.exit_code,
            "signal": signame,
            "duration_s": round(duration_s, 3),
            "verdict": result.verdict.value,
            "reason": result.reason,
            "tail": tail,
            "step": run.step,
            "output_lines": obs.output_lines,
        }
        if obs.output_lines == 0 and obs.spawn_error is None:
            exit_fields["note"] = "exited before writing anything"
        if run.first_step_mono is not None:
            exit_fields["first_step_after_s"] = round(run.first_step_mono - run.started_mono, 3)
        if run.gpu_xids:
            exit_fields["gpu_xids"] = run.gpu_xids
        if obs.spawn_error is not None:
            exit_fields["error"] = obs.spawn_error
        ticket = self.sink.submit_event(run.number, "exit", exit_fields)
        # Let the writer put the exit record on disk before the bookkeeping below takes the GIL.
        self.sink.wait_written(ticket, 0.1)
        log.info(
            "exit",
            run=run.number,
            verdict=result.verdict.value,
            reason=result.reason,
            exit_code=obs.exit_code,
            signal=signame,
        )
        self.last_exit = {"run": run.number, "ended_at": time.time(), **exit_fields}
        if self._history_db is not None:
            self._history_db.ended(
                run.number,
                ended_at=time.time(),
                verdict=result.verdict.value,
                reason=result.reason,
                exit_code=obs.exit_code,
                signal=signame,
                first_step_s=exit_fields.get("first_step_after_s"),
                last_step=run.step,
            )
        early_before = self.history.early_deaths
        decision = decide(
            result.verdict,
            exit_code=obs.exit_code,
            reached_first_step=run.first_step_mono is not None,
            progress_s=progress_s,
            history=self.history,
            policy=self.config.restart,
            jitter=self._rng.random(),
        )
        self.history = decision.history
        self._maybe_alert(run, result.verdict.value, result.reason, exit_fields, early_before)
        if result.verdict is Verdict.STALLED:
            self._recovering_from = "stalled"
        if self._stop_requested:
            self._finish_stop()
        elif decision.action is Action.DONE:
            self._event(run.number, "done", verdict=result.verdict.value)
            self.state = transition(self.state, State.STOPPED)
        elif decision.action is Action.FATAL:
            self._event(run.number, "fatal", reason=decision.reason, verdict=result.verdict.value)
            log.error("fatal", run=run.number, reason=decision.reason)
            self.state = transition(self.state, State.FATAL)
            self._maybe_alert(run, "fatal", decision.reason, exit_fields, 0)
            self.exit_code = EXIT_FATAL
        else:
            self.restarts_by_verdict[result.verdict.value] = (
                self.restarts_by_verdict.get(result.verdict.value, 0) + 1
            )
            self.pending_clear_cache = decision.clear_cache
            self.state = transition(self.state, State.BACKOFF)
            self._event(
                run.number,
                "restart",
                delay_s=round(decision.delay_s, 3),
                cache_cleared=decision.clear_cache,
                verdict=result.verdict.value,
                early_deaths=decision.history.early_deaths,
                runtime_crashes=decision.history.runtime_crashes,
            )
            self.restart_at_mono = now_mono + decision.delay_s
        self._write_state()
        self._systemd.notify(f"STATUS={self._one_line_status()}")

    def _maybe_alert(
        self,
        run: RunContext,
        verdict: str,
        reason: str,
        exit_fields: dict[str, Any],
        early_deaths_before: int,
    ) -> None:
        if not alert_decision(
            verdict,
            on=self.config.alerts.on,
            already_alerted=frozenset(run.alerted),
            early_deaths_before=early_deaths_before,
        ):
            return
        run.alerted.add(verdict)
        if not self.alerts.enabled:
            return
        payload = alert_payload(
            verdict=verdict,
            reason=reason,
            run=run.number,
            exit_code=exit_fields.get("exit_code"),
            signal_name=exit_fields.get("signal"),
            duration_s=exit_fields.get("duration_s"),
            tail=list(exit_fields.get("tail") or []),
            gpus=list(self._gpu_last),
            log=str(self.writer.path),
            step=run.step,
        )
        self.alerts.send(run.number, payload)

    def _alert_done(self, run: int, outcome: AlertOutcome) -> None:
        self._alerts_sent += 1
        # Called on the alert thread: the sink is thread-safe.
        fields = {
            "sink": outcome.sink,
            "ok": outcome.ok,
            "detail": outcome.detail,
            "verdict": outcome.verdict,
            "attempts": outcome.attempts,
        }
        self.sink.submit_event(run, "alert", fields)

    def _finish_stop(self) -> None:
        self._stop_deadline_mono = None
        if self.state is not State.STOPPED:
            self.state = transition(self.state, State.STOPPED)

    # -- control and state --------------------------------------------------------------

    def _on_control(self, conn: Any) -> None:
        req = self.control.read_request(conn)
        if req is None:
            if conn not in self.control.buffers:
                self._selector.unregister(conn)
            return
        self._selector.unregister(conn)
        cmd = req.get("cmd")
        if cmd == "status":
            self.control.reply(conn, self.status())
        elif cmd == "stop":
            timeout = req.get("timeout_s")
            timeout_s = (
                float(timeout)
                if isinstance(timeout, int | float)
                else self.config.restart.stop_timeout_s
            )
            self.request_stop(timeout_s)
            self.control.reply(conn, {"ok": True, "run": self.run.number if self.run else None})
        else:
            self.control.reply(conn, {"ok": False, "error": f"unknown command {cmd!r}"})

    def status(self) -> dict[str, Any]:
        """The ``status --json`` object of DESIGN §8."""
        now = time.monotonic()
        run = self.run
        alive = run is not None and run.launched is not None and self.phase is not Phase.EXITED
        age = None
        if run is not None and alive:
            ref = run.last_progress_mono or run.started_mono
            age = round(now - ref, 3)
        stats = self.sink.stats()
        out: dict[str, Any] = {
            "state": self.state.value,
            "phase": self.phase.value,
            "pid": os.getpid(),
            "child_pid": run.pid if alive and run is not None else None,
            "run": run.number if run else None,
            "step": run.step if run else None,
            "child_status": run.status_text if run else None,
            "last_progress_age_s": age,
            "last_progress_at": None if age is None else time.time() - age,
            "restarts": sum(self.restarts_by_verdict.values()),
            "restarts_by_verdict": dict(self.restarts_by_verdict),
            "last_exit": self.last_exit,
            "gpus": list(self._gpu_last),
            "gpu_checks": self._gpu_status,
            "gpu_method": run.gpu_use.method
            if run is not None and run.gpu_use is not None
            else None,
            "log": str(self.writer.path),
            "home": str(self.home.root),
            "started_at": self.started_wall,
            "updated_at": time.time(),
            "version": __version__,
            "command": list(self.config.command),
            "next_restart_in_s": None
            if self.restart_at_mono is None
            else round(max(0.0, self.restart_at_mono - now), 3),
            "log_stats": {
                "records_written": stats.writer.records_written,
                "bytes_written": stats.writer.bytes_written,
                "records_dropped": stats.writer.records_dropped + stats.stalled_drops_records,
                "bytes_dropped": stats.writer.bytes_dropped + stats.stalled_drops_bytes,
                "last_error": stats.writer.last_error,
            },
        }
        if alive and run is not None and run.launched is not None:
            out["child"] = {"pid": run.launched.pid, "create_time": self._child_create_time}
        return out

    def _mark_dirty(self) -> None:
        if self._state_dirty_since is None:
            self._state_dirty_since = time.monotonic()

    def _write_state(self) -> None:
        self._state_dirty_since = None
        self._last_state_write = time.monotonic()
        state = self.status()
        self._snapshot = state  # replaced whole: a metrics scrape on another thread reads it as is
        state = {**state, "config": config_to_dict(self.config)}
        try:
            write_state(self.home.state_file, state)
        except OSError as exc:
            log.warning("state_write_failed", error=str(exc))
        self._systemd.notify(
            f"STATUS={self._one_line_status()}"
        )  # mirrors `dflashd status` in one line

    def _one_line_status(self) -> str:
        run = self.run
        step = f" step {run.step}" if run is not None and run.step is not None else ""
        number = f" run {run.number}" if run is not None else ""
        return f"{self.state.value}{number} {self.phase.value}{step}"

    def _event(self, run: int, event: str, **fields: Any) -> None:
        self.sink.submit_event(run, event, fields)

    # -- shutdown -----------------------------------------------------------------------

    def _shutdown(self) -> None:
        run = self.run
        # Leftovers of every run we started (grandchildren holding pipes, say) end with us.
        groups = list(self._ended_groups)
        if run is not None and run.launched is not None:
            groups.append(run.launched.pid)
        for pgid in set(groups):
            if _group_members(pgid):
                _terminate_group(pgid, 2.0)
        for child in _own_descendants(exclude=self.alerts.pids):
            try:
                child.kill()
            except psutil.Error:
                pass
        if run is not None:
            for drain in run.drains:
                drain.wait_eof(2.0)
        if self._gpu is not None:
            self._gpu.stop()
        self.alerts.close()
        if self._metrics is not None:
            self._metrics.stop()
        self._event(run.number if run else 0, "daemon_exit", state=self.state.value)
        self._write_state()
        self.sink.close(5.0)
        self.control.close()
        self.notify.close()
        if self._history_db is not None:
            self._history_db.close()
        signal.set_wakeup_fd(-1)


def _no_op_handler(_signum: int, _frame: Any) -> None:
    """The wakeup fd carries the signal; the handler itself must do nothing."""


def _to_int(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


def _cmdline(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())[:200]
    except psutil.Error:
        return "?"


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _create_time(pid: int) -> float:
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return 0.0


def _group_members(pgid: int) -> set[int]:
    """Live (non-zombie) processes whose process group is ``pgid``."""
    members: set[int] = set()
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                members.add(proc.pid)
        except (OSError, psutil.Error):
            continue
    return members


def _own_descendants(exclude: set[int]) -> list[psutil.Process]:
    try:
        return [p for p in psutil.Process().children(recursive=True) if p.pid not in exclude]
    except psutil.Error:
        return []


def _terminate_group(pgid: int, timeout_s: float) -> None:
    """SIGTERM a group we started, SIGKILL what is left after ``timeout_s``."""
    signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _group_members(pgid):
            return
        _reap_any()
        time.sleep(0.05)
    signal_group(pgid, signal.SIGKILL)
    _reap_any()


def _reap_any() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _default_sampler(daemon: Daemon) -> GpuSampler:
    script = os.environ.get("DFLASHD_GPU_SCRIPT")
    if script:
        # Test and demo hook: replay scripted readings instead of NVML.
        return ScriptedSampler(
            Path(script), lambda: daemon.run.pid if daemon.run is not None else None
        )
    return NvmlSampler(daemon.config.gpus)
