"""Alerts: who hears about a bad run, off the daemon's main path.

Whether to alert is decided elsewhere (:func:`~dflashd.supervisor.model.incidents.alert_decision`, pure); this is delivery.  Each sink (webhook, command, file) has a thread of
its own, so one that hangs or fails never silences the other; each webhook attempt has an
overall deadline and is retried with backoff; nothing a sink raises ends its thread.  A
hung webhook or alert command never stalls death detection or pipe draining.  The webhook URL is a secret: it is never
written to a log record, ``status`` or ``state.json`` (only its host, in outcomes).
"""

from __future__ import annotations

import queue
import re
import socket
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from dflashd.logs.safejson import dumps_any
from dflashd.supervisor.host.config import AlertsConfig
from dflashd.supervisor.host.custody import end_own_child_session
from dflashd.supervisor.model.verdicts import Notice
from dflashd.supervisor.speak.alertfile import append_alert

COMMAND_TIMEOUT_S: Final = 30.0
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
    stacks: list[str] | None = None,
) -> dict[str, Any]:
    """The alert JSON of docs/design.md ("Alerts"); ``stacks``: the top frames of each
    process's main thread, dumped before dflashd ended the run."""
    payload: dict[str, Any] = {
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
    if stacks:
        payload["stacks"] = stacks
    return payload


def summary_text(payload: dict[str, Any]) -> str:
    """One readable paragraph (Slack's ``text``): host, run, verdict, reason, stderr tail, log."""
    verdict = payload["verdict"]
    if verdict == Notice.RECOVERED:
        return (
            f":white_check_mark: dflashd on {payload['host']}: training resumed in run {payload['run']}, "
            f"step {payload.get('step')} ({payload['reason']}). Log: {payload['log']}"
        )
    how = (
        f"exit code {payload['exit_code']}"
        if payload.get("exit_code") is not None
        else (payload.get("signal") or "no exit status")
    )
    duration = payload.get("duration_s")
    after = f" after {duration:.1f}s" if isinstance(duration, int | float) else ""
    if payload.get("error"):  # it never ran: the OS said why
        how, after = f"spawn failed: {payload['error']}", ""
    if payload.get("run_verdict") and payload["run_verdict"] != verdict:
        how = f"run {payload['run_verdict']}, {how}"
    text = (
        f":rotating_light: dflashd on {payload['host']}: run {payload['run']} *{verdict}* "
        f"({payload['reason']}), {how}{after}. Log: {payload['log']}"
    )
    tail = payload.get("tail") or []
    if tail:
        text += "\n```\n" + "\n".join(str(line)[:300] for line in tail[-15:]) + "\n```"
    if payload.get("hung_after_s") is not None:
        text += f"\nHung: no step for {payload['hung_after_s']}s, every rank waiting."
    if payload.get("hang_evidence"):
        text += f"\nProof: {payload['hang_evidence']}"
    waited = payload.get("waited_elsewhere")
    if isinstance(waited, dict):
        text += f"\nBefore it died it waited {waited.get('for_s')}s on: {waited.get('why')}"
    if payload.get("odd_rank_out"):
        text += f"\nOdd rank out: {payload['odd_rank_out']}"
    stacks = payload.get("stacks")
    if stacks:
        text += "\nWhere it hung:\n```\n" + "\n".join(str(x)[:300] for x in stacks[:41]) + "\n```"
    if payload.get("dump"):
        text += f"\nThe whole dump: {payload['dump']}"
    locks = payload.get("stale_build_locks")
    if locks:
        text += "\nStale JIT-build locks (remove them if no build runs): " + ", ".join(locks[:5])
    return text


def redact_url(url: str) -> str:
    """What may be shown of a webhook URL: its scheme and host, never the path (the secret)."""
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or '?'}/…"


_ANY_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")


def without_url(text: str, url: str) -> str:
    """``text`` without the webhook's secret parts: the URL, its path and query (where the
    token lives), its password, and any URL at all, each replaced by ``<redacted>``."""
    parts = urllib.parse.urlsplit(url)
    secrets = [url, parts.path, parts.query, parts.password or "", parts.netloc]
    secrets += [urllib.parse.quote(s) for s in secrets] + [repr(s)[1:-1] for s in secrets]
    for secret in sorted({s for s in secrets if len(s) > 1}, key=len, reverse=True):
        text = text.replace(secret, "<redacted>")
    return _ANY_URL.sub("<redacted>", text)


def post_webhook(
    url: str, payload: dict[str, Any], timeout_s: float = WEBHOOK_TIMEOUT_S
) -> tuple[bool, str]:
    """One POST of Slack-compatible JSON within ``timeout_s`` overall; (ok, detail), no secret.

    The deadline covers the whole request: a timer shuts the socket down when it passes,
    so an endpoint that trickles a byte a second cannot hold the sink.  Any answer that is
    not HTTP (an SSH banner, say) is a failed attempt, never an exception.
    """
    # Imported here: http.client pulls in ssl, megabytes a daemon without a webhook never needs.
    import http.client

    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False, "not an http(s) URL"
    body = dumps_any({"text": summary_text(payload), **payload})
    conn_type = (
        http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    )
    conn = conn_type(parts.hostname, parts.port, timeout=timeout_s)
    expired = threading.Event()

    def cut() -> None:
        expired.set()
        sock = conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    timer = threading.Timer(timeout_s, cut)
    timer.daemon = True
    timer.start()
    try:
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        headers = {"Content-Type": "application/json", "User-Agent": "dflashd"}
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        response.read(65536)
        status = int(response.status)
    except Exception as exc:  # http.client.HTTPException, OSError, ssl errors: all one failure
        if expired.is_set():
            return False, f"no answer within {timeout_s:g}s"
        return False, without_url(f"{type(exc).__name__}: {exc}", url)[:200]
    finally:
        timer.cancel()
        conn.close()
    return (200 <= status < 300), f"HTTP {status}"


class _AlertSink:
    """One alert sink on its own thread: a failure or hang of one never silences another."""

    def __init__(self, name: str, deliver: Callable[[dict[str, Any], str], AlertOutcome]) -> None:
        self.name, self._deliver = name, deliver
        self._queue: queue.SimpleQueue[tuple[int, dict[str, Any], Callable[..., None]] | None] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None
        self.busy = threading.Event()

    def put(
        self, run: int, payload: dict[str, Any], done: Callable[[int, AlertOutcome], None]
    ) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._serve, name=f"dflashd-alert-{self.name}", daemon=True
            )
            self._thread.start()
        self._queue.put((run, payload, done))

    def _serve(self) -> None:
        while True:  # nothing raised here ends the loop: the dispatcher cannot die
            item = self._queue.get()
            if item is None:
                return
            run, payload, done = item
            verdict = str(payload.get("verdict"))
            self.busy.set()
            try:
                outcome = self._deliver(payload, verdict)
            except Exception as exc:
                outcome = AlertOutcome(self.name, False, f"{type(exc).__name__}: {exc}"[:200])
            finally:
                self.busy.clear()
            try:
                done(
                    run,
                    AlertOutcome(
                        outcome.sink, outcome.ok, outcome.detail, verdict, outcome.attempts
                    ),
                )
            except Exception:
                pass  # the record could not be written: the next alert still goes out

    def finish(self) -> None:
        if self._thread is not None:
            self._queue.put(None)

    def join(self, timeout_s: float) -> None:
        if self._thread is not None:
            self._thread.join(max(0.0, timeout_s))


class AlertDispatcher:
    """One thread per sink; tracks the pids of alert commands (they are not the child's).

    :meth:`from_config` builds the sinks the ``[alerts]`` table names: a new sink is a key of
    :class:`~dflashd.supervisor.host.config.AlertsConfig` and a deliverer here, nothing else.
    """

    @classmethod
    def from_config(
        cls, alerts: AlertsConfig, on_outcome: Callable[[int, AlertOutcome], None]
    ) -> AlertDispatcher:
        """The dispatcher for the config's ``[alerts]`` table, one sink per key that is set."""
        dispatcher = cls(alerts.command, on_outcome, alerts.webhook_url)
        if alerts.file:
            path = alerts.file
            dispatcher._sinks.append(
                _AlertSink("file", lambda p, v: AlertOutcome("file", *append_alert(path, p), v))
            )
        return dispatcher

    def __init__(
        self,
        command: tuple[str, ...],
        on_outcome: Callable[[int, AlertOutcome], None],
        webhook_url: str = "",
        *,
        webhook_timeout_s: float = WEBHOOK_TIMEOUT_S,
        retry_delay_s: float = 1.0,
        command_timeout_s: float = COMMAND_TIMEOUT_S,
    ) -> None:
        self._command = command
        self._webhook_url = webhook_url
        self._webhook_timeout_s = webhook_timeout_s
        self._retry_delay_s = retry_delay_s
        self._command_timeout_s = command_timeout_s
        self._on_outcome = on_outcome
        self.pids: set[int] = set()
        self._running: dict[int, subprocess.Popen[bytes]] = {}
        self._ended_at_exit: set[int] = set()
        self._closing = threading.Event()
        self._sinks: list[_AlertSink] = []
        if webhook_url:
            self._sinks.append(_AlertSink("webhook", self._deliver_webhook))
        if command:
            self._sinks.append(_AlertSink("command", self._run_command))

    @property
    def enabled(self) -> bool:
        """True when a sink is configured."""
        return bool(self._sinks)

    @property
    def sink_names(self) -> list[str]:
        """The configured sinks: ``webhook``, ``command``."""
        return [sink.name for sink in self._sinks]

    @property
    def busy(self) -> bool:
        """True while a delivery is under way."""
        return any(sink.busy.is_set() for sink in self._sinks)

    def send(self, run: int, payload: dict[str, Any]) -> None:
        """Queue one alert on every sink; returns at once."""
        for sink in self._sinks:
            sink.put(run, payload, self._on_outcome)

    def _deliver_webhook(self, payload: dict[str, Any], verdict: str) -> AlertOutcome:
        detail = ""
        attempt = 0
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

    def _run_command(self, payload: dict[str, Any], verdict: str) -> AlertOutcome:
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
        self._running[proc.pid] = proc
        try:
            _, err = proc.communicate(dumps_any(payload), timeout=self._command_timeout_s)
        except subprocess.TimeoutExpired:
            end_own_child_session(proc)
            proc.wait()
            return AlertOutcome(
                "command", False, f"timed out after {self._command_timeout_s:.0f}s", verdict
            )
        finally:
            self._running.pop(proc.pid, None)
            self.pids.discard(proc.pid)
        if proc.pid in self._ended_at_exit:
            return AlertOutcome(
                "command", False, "still running at the daemon's exit: ended", verdict
            )
        if proc.returncode != 0:
            detail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
            return AlertOutcome("command", False, f"exit code {proc.returncode}: {detail[0]}")
        return AlertOutcome("command", True, "delivered")

    def close(self, timeout_s: float = 20.0) -> None:
        """Let queued alerts finish, bounded; at the bound, end alert commands still running.

        Retries stop 2 s before the bound; a command still running at the bound has its
        session SIGKILLed, so no alert command outlives the daemon.
        """
        deadline = time.monotonic() + timeout_s
        for sink in self._sinks:
            sink.finish()
        for sink in self._sinks:
            sink.join(deadline - time.monotonic() - 2.0)
        self._closing.set()
        for sink in self._sinks:
            sink.join(deadline - time.monotonic())
        for proc in list(self._running.values()):
            self._ended_at_exit.add(proc.pid)
            end_own_child_session(proc)
        for sink in self._sinks:  # its outcome record: the sink returns at once now
            sink.join(1.0)
