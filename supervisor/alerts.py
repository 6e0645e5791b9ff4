"""Alerts: who hears about a bad run, off the daemon's main path.

The policy (:func:`should_alert`) is pure.  Delivery runs on a worker thread with a
timeout, so a hung alert command never stalls death detection or pipe draining.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import orjson

_COMMAND_TIMEOUT_S: Final = 30.0


@dataclass(frozen=True, slots=True)
class AlertOutcome:
    """What happened to one delivery attempt (becomes an ``alert`` record)."""

    sink: str
    ok: bool
    detail: str


def should_alert(verdict: str, *, on: tuple[str, ...], already_alerted: frozenset[str]) -> bool:
    """One alert per verdict per run, for the verdicts listed in ``alerts.on``."""
    return verdict in on and verdict not in already_alerted


def alert_payload(
    *,
    verdict: str,
    reason: str,
    run: int,
    exit_code: int | None,
    signal_name: str | None,
    duration_s: float | None,
    tail: list[str],
    gpus: list[dict[str, Any]],
    log: str,
) -> dict[str, Any]:
    """The alert JSON of DESIGN §7."""
    return {
        "verdict": verdict,
        "reason": reason,
        "run": run,
        "exit_code": exit_code,
        "signal": signal_name,
        "duration_s": duration_s,
        "tail": tail,
        "gpus": gpus,
        "log": log,
        "host": socket.gethostname(),
    }


class AlertDispatcher:
    """A worker thread that runs the ``command`` sink; tracks the pids it starts (they are not the child's)."""

    def __init__(
        self, command: tuple[str, ...], on_outcome: Callable[[int, AlertOutcome], None]
    ) -> None:
        self._command = command
        self._on_outcome = on_outcome
        self._queue: queue.SimpleQueue[tuple[int, dict[str, Any]] | None] = queue.SimpleQueue()
        self.pids: set[int] = set()
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        """True when a sink is configured."""
        return bool(self._command)

    def send(self, run: int, payload: dict[str, Any]) -> None:
        """Queue one alert; returns at once."""
        if not self.enabled:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="dflashd-alerts", daemon=True)
            self._thread.start()
        self._queue.put((run, payload))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            run, payload = item
            self._on_outcome(run, self._run_command(payload))

    def _run_command(self, payload: dict[str, Any]) -> AlertOutcome:
        try:
            proc = subprocess.Popen(
                list(self._command),
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            return AlertOutcome("command", False, f"cannot run alert command: {exc.strerror}")
        self.pids.add(proc.pid)
        try:
            _, err = proc.communicate(orjson.dumps(payload), timeout=_COMMAND_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return AlertOutcome("command", False, f"timed out after {_COMMAND_TIMEOUT_S:.0f}s")
        finally:
            self.pids.discard(proc.pid)
        if proc.returncode != 0:
            detail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
            return AlertOutcome("command", False, f"exit code {proc.returncode}: {detail[0]}")
        return AlertOutcome("command", True, "delivered")

    def close(self) -> None:
        """Let queued alerts finish (bounded by the command timeout)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(_COMMAND_TIMEOUT_S + 1)
