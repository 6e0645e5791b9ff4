"""Alerts: who hears about a bad run, off the daemon's main path.

The policy (:func:`alert_decision`) is pure.  Delivery runs on a worker thread, each
attempt bounded by a timeout and retried with backoff, so a hung webhook or alert command
never stalls death detection or pipe draining.  The webhook URL is a secret: it is never
written to a log record, ``status`` or ``state.json`` (only its host, in outcomes).
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import orjson

from dflashd.supervisor.verdicts import EARLY_DEATH_NAMES, AlertKind

_COMMAND_TIMEOUT_S: Final = 30.0
WEBHOOK_TIMEOUT_S: Final = 5.0
WEBHOOK_ATTEMPTS: Final = 3


@dataclass(frozen=True, slots=True)
class AlertOutcome:
    """What happened to one delivery (becomes an ``alert`` record)."""

    sink: str
    ok: bool
    detail: str
    verdict: str = ""
    attempts: int = 1


def alert_decision(
    kind: AlertKind,
    *,
    on: tuple[AlertKind, ...],
    already_alerted: frozenset[AlertKind],
    early_deaths_before: int,
) -> bool:
    """Whether to alert: one alert per verdict per run, for the verdicts in ``alerts.on``.

    A crash loop alerts on its first early death and on the ``fatal``, not on every
    attempt: an early death that follows another early death stays quiet.
    """
    if kind not in on or kind in already_alerted:
        return False
    return not (kind.value in EARLY_DEATH_NAMES and early_deaths_before > 0)


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
    step: int | None = None,
) -> dict[str, Any]:
    """The alert JSON of docs/design.md ("Alerts")."""
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
        "step": step,
    }


def summary_text(payload: dict[str, Any]) -> str:
    """One readable paragraph (Slack's ``text``): host, run, verdict, reason, stderr tail, log."""
    verdict = payload["verdict"]
    if verdict == AlertKind.RECOVERED:
        return (
            f":white_check_mark: dflashd on {payload['host']}: training resumed in run {payload['run']}, "
            f"step {payload.get('step')} (after {payload['reason']}). Log: {payload['log']}"
        )
    how = (
        f"exit code {payload['exit_code']}"
        if payload.get("exit_code") is not None
        else (payload.get("signal") or "no exit status")
    )
    duration = payload.get("duration_s")
    after = f" after {duration:.1f}s" if isinstance(duration, int | float) else ""
    text = (
        f":rotating_light: dflashd on {payload['host']}: run {payload['run']} *{verdict}* "
        f"({payload['reason']}), {how}{after}. Log: {payload['log']}"
    )
    tail = payload.get("tail") or []
    if tail:
        text += "\n```\n" + "\n".join(str(line)[:300] for line in tail[-15:]) + "\n```"
    return text


def redact_url(url: str) -> str:
    """What may be shown of a webhook URL: its scheme and host, never the path (the secret)."""
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or '?'}/…"


def post_webhook(
    url: str, payload: dict[str, Any], timeout_s: float = WEBHOOK_TIMEOUT_S
) -> tuple[bool, str]:
    """One POST of Slack-compatible JSON; (ok, detail) with no secret in the detail."""
    # Imported here: urllib.request pulls in http.client and ssl, megabytes a daemon without a webhook never needs.
    import urllib.error
    import urllib.request

    body = orjson.dumps({"text": summary_text(payload), **payload}, default=str)
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": "dflashd"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            status = int(response.status)
    except urllib.error.HTTPError as exc:
        return False, f"HTTP {exc.code}"
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return False, f"{type(reason).__name__}: {reason}"[:200]
    return (200 <= status < 300), f"HTTP {status}"


class AlertDispatcher:
    """A worker thread that runs the sinks; tracks the pids it starts (they are not the child's)."""

    def __init__(
        self,
        command: tuple[str, ...],
        on_outcome: Callable[[int, AlertOutcome], None],
        webhook_url: str = "",
        *,
        webhook_timeout_s: float = WEBHOOK_TIMEOUT_S,
        retry_delay_s: float = 1.0,
    ) -> None:
        self._command = command
        self._webhook_url = webhook_url
        self._webhook_timeout_s = webhook_timeout_s
        self._retry_delay_s = retry_delay_s
        self._on_outcome = on_outcome
        self._queue: queue.SimpleQueue[tuple[int, dict[str, Any]] | None] = queue.SimpleQueue()
        self.pids: set[int] = set()
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()

    @property
    def enabled(self) -> bool:
        """True when a sink is configured."""
        return bool(self._command) or bool(self._webhook_url)

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
            verdict = str(payload.get("verdict"))
            if self._webhook_url:
                self._on_outcome(run, self._deliver_webhook(payload, verdict))
            if self._command:
                outcome = self._run_command(payload)
                self._on_outcome(
                    run, AlertOutcome(outcome.sink, outcome.ok, outcome.detail, verdict)
                )

    def _deliver_webhook(self, payload: dict[str, Any], verdict: str) -> AlertOutcome:
        detail = ""
        for attempt in range(1, WEBHOOK_ATTEMPTS + 1):
            ok, detail = post_webhook(self._webhook_url, payload, self._webhook_timeout_s)
            if ok:
                return AlertOutcome("webhook", True, detail, verdict, attempt)
            if attempt < WEBHOOK_ATTEMPTS and self._closing.wait(
                self._retry_delay_s * 2 ** (attempt - 1)
            ):
                break  # shutting down: stop retrying
        return AlertOutcome(
            "webhook", False, f"{detail} ({redact_url(self._webhook_url)})", verdict, attempt
        )

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
            _, err = proc.communicate(
                orjson.dumps(payload, default=str), timeout=_COMMAND_TIMEOUT_S
            )
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

    def close(self, timeout_s: float = 20.0) -> None:
        """Let queued alerts finish, bounded: retries stop early and the wait is capped."""
        if self._thread is not None:
            self._queue.put(None)
            deadline = time.monotonic() + timeout_s
            self._thread.join(max(0.0, deadline - time.monotonic() - 2.0))
            self._closing.set()
            self._thread.join(max(0.0, deadline - time.monotonic()))
