"""Everything the daemon tells the outside world: the run log, alerts, runs.sqlite, state.json,
systemd's STATUS line and the Prometheus snapshot.

The daemon decides; the :class:`Reporter` writes.  Every persistence path here degrades
instead of raising into the loop: a full disk under runs.sqlite or state.json is logged and
counted, the run goes on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from dflashd.logs.logdir import LogDir
from dflashd.logs.sink import LogSink
from dflashd.logs.writer import RotatingLogWriter
from dflashd.supervisor.host.clock import Clock, SystemClock
from dflashd.supervisor.host.config import Config, config_to_dict
from dflashd.supervisor.host.home import Home
from dflashd.supervisor.host.notify import SystemdNotifier
from dflashd.supervisor.host.pyspy import RUNNING_DUMPS
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.goodput import Cost, cost_to_json
from dflashd.supervisor.model.verdicts import AlertKind, Notice
from dflashd.supervisor.speak.alerts import AlertDispatcher, AlertOutcome, alert_payload
from dflashd.supervisor.speak.diagnostics import get_logger
from dflashd.supervisor.speak.history import RunHistory, open_history
from dflashd.supervisor.speak.statusview import LogStats, StatusView, write_state

log = get_logger("dflashd")
GOODPUT_SAVE_EVERY_S: Final = 2.0
_NOT_LOGGED: Final = frozenset(
    {"tail", "gpus", "holders", "traceback", "argv", "env_keys", "refused"}
)


class MetricsUnavailable(Exception):
    """``metrics_listen`` cannot be served (busy, not ours); the message says why."""


class Reporter:
    """The run log, alerts, history, state.json, systemd and metrics, behind one small interface."""

    def __init__(
        self, home: Home, config: Config, systemd: SystemdNotifier, clock: Clock | None = None
    ) -> None:
        self.home, self.config, self.systemd = home, config, systemd
        logs = config.logs
        wall = (clock or SystemClock()).time  # records' ``ts``: the daemon's (injected) clock
        self.writer = RotatingLogWriter(
            home.logs,
            max_bytes=logs.max_bytes,
            backups=logs.backups,
            compress=logs.compress,
            clock=wall,
        )
        self.sink = LogSink(self.writer, clock=wall)
        # the home held open: state.json goes into this directory even if its path is swapped
        self.home_dir = LogDir(home.root)
        self._home_swapped = False
        self.alerts = AlertDispatcher.from_config(config.alerts, self._alert_done)
        self.history: RunHistory | None = None
        self.history_errors = 0
        self.state_errors = 0
        self.snapshot: dict[str, Any] = {}
        self._metrics: Any = None
        self._alerts_sent: dict[str, float] = {}
        self._goodput_saved = float("-inf")
        self._goodput_stored: dict[str, Any] | None = None  # the totals runs.sqlite holds
        self._wall = wall
        # the last alert handed to the sinks, and what each sink said (None: not yet)
        self.last_alert: dict[str, Any] | None = None
        self._alert_lock = threading.Lock()
        self.stack_dumps = 0  # dumps written (metrics)  # "kind:ok" -> deliveries (metrics)

    def helper_pids(self) -> set[int]:
        """Our own helpers' pids (alert commands, the compression helper, py-spy): the
        orphan reaper leaves their exit status to the code that waits for them."""
        pids = set(self.alerts.pids) | RUNNING_DUMPS
        compressor = self.writer.compressor
        if compressor is not None and compressor.helper_pid is not None:
            pids.add(compressor.helper_pid)
        return pids

    @property
    def log_path(self) -> Path:
        """The live run log."""
        return self.writer.path

    @property
    def frames(self) -> LogSink:
        """Where the drains hand the child's output (the run log's sink)."""
        return self.sink

    def flush(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for everything submitted to be on disk."""
        return self.sink.flush(timeout_s)

    def last_run_seen(self) -> int:
        """The highest run number the log and runs.sqlite know (0: none)."""
        known = [self.writer.last_run]
        if self.history is not None:
            try:
                known.append(self.history.last_run())
            except Exception as exc:  # sqlite3.Error: a broken history must not stop a launch
                log.warning("history_read_failed", error=str(exc))
        return max(known)

    def stack_dump_written(self) -> None:
        """Count one stack dump (metrics)."""
        self.stack_dumps += 1

    def open_history(self) -> None:
        """runs.sqlite (None-safe: an unusable file only means less history)."""
        self.history = open_history(self.home.runs_db, self.config.logs.history_runs)

    # -- the run log ------------------------------------------------------------------

    def record(
        self,
        run_no: int,
        event: Event,
        /,
        *,
        log_level: str | None = None,
        wait_s: float | None = None,
        **fields: Any,
    ) -> int:
        """Write one ``dflashd`` record (the one verb for it); returns its ticket.

        ``log_level``: also one line of dflashd's own log at that level.  ``wait_s``: wait
        up to that long for the record to be on disk (``spawn`` before the fork, ``exit``
        before the bookkeeping).
        """
        ticket = self.sink.submit_event(run_no, event, fields)
        if wait_s is not None:
            self.sink.wait_written(ticket, wait_s)
        if log_level is not None:
            self._log(log_level, run_no, event, fields)
        return ticket

    @staticmethod
    def _log(level: str, run_no: int, event: Event, fields: dict[str, Any]) -> None:
        small = {k: v for k, v in fields.items() if k not in _NOT_LOGGED and k != "run"}
        getattr(log, level)(event.value, run=run_no, **small)

    def log_stats(self) -> LogStats:
        """The run log's counters for status."""
        stats = self.sink.stats()
        return {
            "records_written": stats.writer.records_written,
            "bytes_written": stats.writer.bytes_written,
            "records_dropped": stats.writer.records_dropped + stats.stalled_drops_records,
            "bytes_dropped": stats.writer.bytes_dropped + stats.stalled_drops_bytes,
            "last_error": stats.writer.last_error,
        }

    # -- alerts -----------------------------------------------------------------------

    def alert(
        self,
        run_no: int,
        step: int | None,
        kind: AlertKind,
        reason: str,
        fields: dict[str, Any],
        gpus: list[dict[str, Any]],
    ) -> None:
        """Hand one alert to the sinks (returns at once; each sink has its own thread)."""
        if not self.alerts.enabled:
            return
        payload = alert_payload(
            verdict=kind.value,
            reason=reason,
            run=run_no,
            exit_code=fields.get("exit_code"),
            signal_name=fields.get("signal"),
            duration_s=fields.get("duration_s"),
            tail=list(fields.get("tail") or []),
            gpus=gpus,
            log=str(self.writer.path),
            # a run the daemon did not watch to its end (lost with a killed daemon): its step
            # is its exit record's
            step=step if step is not None else fields.get("step"),
            stacks=(fields.get("stacks") or {}).get("top"),
        )
        first = ("hung_after_s", "hang_evidence", "waited_elsewhere", "stale_build_locks", "error")
        paced = ("ratio", "baseline_step_s", "recent_step_s", "causes", "slow_for_s", "why")
        paced_too = ("last_good_step", "recovered_from")
        for key in (*first, *paced, *paced_too):  # what a person acts on first
            if fields.get(key) is not None and fields.get(key) != []:
                payload[key] = fields[key]
        # where and when, for a person paged at night and for a dashboard joining many homes
        payload["time"] = datetime.fromtimestamp(self._wall(), UTC).isoformat(timespec="seconds")
        payload["node"] = self.config.node_name
        payload["home"] = str(self.home.root)
        payload["command"] = list(self.config.command)
        if kind is Notice.FATAL and fields.get("verdict"):
            payload["run_verdict"] = fields["verdict"]  # the early death behind the fatal, say
        dump = (fields.get("stacks") or {}).get("path")
        if isinstance(dump, str):  # the whole dump, every thread: where to read it
            payload["dump"] = dump
        odd = (fields.get("stacks") or {}).get("odd_summary")
        if odd:
            payload["odd_rank_out"] = odd
        with self._alert_lock:
            self.last_alert = self._new_alert(kind, reason, run_no)
        self.alerts.send(run_no, payload)

    def _new_alert(self, kind: AlertKind, reason: str, run_no: int) -> dict[str, Any]:
        return {
            "kind": kind.value,
            "reason": reason,
            "run": run_no,
            "at": self._wall(),
            "sinks": {name: None for name in self.alerts.sink_names},
        }

    def _alert_done(self, run_no: int, outcome: AlertOutcome) -> None:
        with self._alert_lock:  # two sinks may finish at once, each on its own thread
            last = self.last_alert  # replaced whole, never changed in place: status reads it
            if last is not None and last["run"] == run_no and last["kind"] == outcome.verdict:
                took = {"ok": outcome.ok, "detail": outcome.detail, "attempts": outcome.attempts}
                self.last_alert = {**last, "sinks": {**last["sinks"], outcome.sink: took}}
        key = f"{outcome.verdict}:{'true' if outcome.ok else 'false'}"
        self._alerts_sent = {**self._alerts_sent, key: self._alerts_sent.get(key, 0.0) + 1}
        fields: dict[str, Any] = {
            "sink": outcome.sink,
            "ok": outcome.ok,
            "detail": outcome.detail,
            "verdict": outcome.verdict,
            "attempts": outcome.attempts,
        }
        self.record(run_no, Event.ALERT, **fields)

    # -- history, state, systemd --------------------------------------------------------

    def record_history(self, write: Callable[[RunHistory], None]) -> None:
        """A convenience store: a full disk or a broken file is logged and counted, never raised."""
        import sqlite3

        if self.history is None:
            return
        try:
            write(self.history)
        except sqlite3.Error as exc:
            self.history_errors += 1
            if self.history_errors == 1 or self.history_errors % 100 == 0:
                log.warning("history_write_failed", error=str(exc), failures=self.history_errors)

    def save_goodput(
        self,
        first_start: float,
        totals: Cost,
        *,
        best_step: int | None,
        daemon_ended: bool,
        now: float,
        shown: bool = False,
    ) -> bool:
        """The goodput ledger into runs.sqlite: every few seconds, when the daemon ends, and
        when totals are shown (``shown``: status served them); True when saved.  A daemon
        killed outright loses only what the run log cannot give back (recovery.py)."""
        stored: dict[str, Any] = {**cost_to_json(totals), "best_step": best_step}
        if shown and stored == self._goodput_stored:
            return False  # shown before, and saved then
        if not (daemon_ended or shown) and now - self._goodput_saved < GOODPUT_SAVE_EVERY_S:
            return False
        self._goodput_saved, self._goodput_stored = now, stored
        self.record_history(
            lambda db: db.save_goodput(first_start, stored, daemon_ended=daemon_ended, saved_at=now)
        )
        return True

    def publish(self, view: StatusView, one_line: str) -> None:
        """state.json, the metrics snapshot and systemd's STATUS=, from one status view."""
        state: dict[str, Any] = dict(view)
        self.snapshot = state  # replaced whole: a scrape on another thread reads it as is
        self._check_home()
        try:
            write_state(
                self.home.state_file,
                {**state, "config": config_to_dict(self.config)},
                dir_fd=self.home_dir.fd,
            )
        except OSError as exc:
            self.state_errors += 1
            log.warning("state_write_failed", error=str(exc))
        self.systemd.notify(f"STATUS={one_line}")

    def _check_home(self) -> None:
        """The home's path swapped (for a link to another user's directory, say): said once;
        state.json keeps going into the directory this daemon opened."""
        swapped = self.home_dir.check() is not None
        if swapped and not self._home_swapped:
            self.record(0, Event.HOME_REPLACED, log_level="warning", path=str(self.home.root))
        self._home_swapped = swapped

    # -- metrics ----------------------------------------------------------------------

    def start_metrics(self, ping: Callable[[], threading.Event] | None = None) -> None:
        """Serve /metrics when configured (a ``metrics_on`` record), or raise MetricsUnavailable;
        ``ping``: the loop's inbox, which /healthz asks whether the loop still turns."""
        if not self.config.metrics_listen:
            return
        from dflashd.supervisor.speak.metrics import MetricsServer

        def extra() -> dict[str, Any]:
            stats = self.sink.stats()
            return {
                "log_written_bytes": float(stats.writer.bytes_written),
                "log_dropped_bytes": float(stats.writer.bytes_dropped + stats.stalled_drops_bytes),
                "alerts_by_kind": self._alerts_sent,
                "stack_dumps": float(self.stack_dumps),
            }

        server = MetricsServer(self.config.metrics_listen, lambda: self.snapshot, extra, ping)
        try:
            server.start()
        except OSError as exc:
            raise MetricsUnavailable(
                f"metrics_listen {self.config.metrics_listen}: {exc.strerror or exc}"
            ) from None
        self._metrics = server
        self.record(0, Event.METRICS_ON, listen=f"{server.host}:{server.port}")

    def close(self) -> None:
        """Let alerts finish (bounded), stop metrics, flush and close the log and history."""
        self.alerts.close()
        if self._metrics is not None:
            self._metrics.stop()
        self.sink.close(5.0)
        if self.history is not None:
            self.history.close()
        self.home_dir.close()
