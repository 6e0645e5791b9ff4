"""Webhook alerts against real HTTP servers on loopback, and metrics scraped over real HTTP."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dflashd.supervisor.model.incidents import alert_decision
from dflashd.supervisor.model.verdicts import DEFAULT_ALERTS, alert_kind
from dflashd.supervisor.speak.alerts import AlertDispatcher, AlertOutcome, summary_text
from tests.conftest import Daemon, child

Start = Callable[..., Daemon]


class Hook:
    """A loopback HTTP server that records POSTs; behaviour: 'ok', '500' or 'hang'."""

    def __init__(self, behaviour: str) -> None:
        self.bodies: list[dict[str, object]] = []
        self.hits = 0
        self.release = threading.Event()
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                hook.hits += 1
                body = self.rfile.read(int(self.headers["Content-Length"]))
                hook.bodies.append(json.loads(body))
                if behaviour == "hang":
                    hook.release.wait(30)
                    return
                self.send_response(500 if behaviour == "500" else 200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/services/T000/SECRETPATH"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hook_factory() -> Iterator[Callable[[str], Hook]]:
    """Start loopback webhook servers; shut them down after the test."""
    callbacks: list[Hook] = []

    def make(behaviour: str) -> Hook:
        callbacks.append(Hook(behaviour))
        return callbacks[-1]

    yield make
    for hook in callbacks:
        hook.close()


@pytest.mark.parametrize(
    ("verdict", "alerted", "early_before", "expected"),
    [
        ("crash_before_first_step", set(), 0, True),
        ("crash_before_first_step", set(), 2, False),  # a crash loop: not every attempt
        ("crash_before_first_step", {"crash_before_first_step"}, 0, False),
        ("fatal", set(), 5, True),
        ("crashed", set(), 0, False),  # not in `on` by default
        ("recovered", set(), 0, True),
    ],
)
def test_alert_policy(verdict: str, alerted: set[str], early_before: int, expected: bool) -> None:
    """One alert per verdict per run; a crash loop alerts on its first early death and the fatal."""
    assert (
        alert_decision(
            alert_kind(verdict),
            on=DEFAULT_ALERTS,
            already_alerted=frozenset(alert_kind(a) for a in alerted),
            early_deaths_before=early_before,
        )
        is expected
    )


def test_summary_is_one_readable_paragraph_with_the_tail() -> None:
    """Slack text names host, run, verdict, reason, exit, log, with the stderr tail in a code block."""
    text = summary_text(
        {
            "verdict": "crash_before_first_step",
            "reason": "import_error",
            "run": 3,
            "exit_code": 1,
            "signal": None,
            "duration_s": 0.4,
            "tail": ["ModuleNotFoundError: x"],
            "host": "box",
            "log": "/l",
        }
    )
    assert (
        "box" in text
        and "run 3" in text
        and "crash_before_first_step" in text
        and "import_error" in text
    )
    assert "```\nModuleNotFoundError: x\n```" in text


def test_webhook_posts_slack_json_and_retries_a_500(hook_factory: Callable[[str], Hook]) -> None:
    """A 500 is retried (3 attempts), then reported failed without the secret path."""
    ok_hook, bad_hook = hook_factory("ok"), hook_factory("500")
    outcomes: list[AlertOutcome] = []
    done = threading.Event()

    def record(_run: int, outcome: AlertOutcome) -> None:
        outcomes.append(outcome)
        done.set()

    payload = {
        "verdict": "fatal",
        "reason": "early_retries_exhausted",
        "run": 2,
        "exit_code": 1,
        "signal": None,
        "duration_s": 1.0,
        "tail": ["boom"],
        "gpus": [],
        "log": "/x",
        "host": "h",
    }
    for hook in (ok_hook, bad_hook):
        done.clear()
        dispatcher = AlertDispatcher((), record, hook.url, retry_delay_s=0.01)
        dispatcher.send(2, payload)
        assert done.wait(20)
        dispatcher.close()
    assert outcomes[0].ok and outcomes[0].attempts == 1
    body = ok_hook.bodies[0]
    assert "text" in body and body["verdict"] == "fatal" and body["run"] == 2
    assert not outcomes[1].ok and outcomes[1].attempts == 3 and bad_hook.hits == 3
    assert "HTTP 500" in outcomes[1].detail and "SECRETPATH" not in outcomes[1].detail


def test_hung_webhook_never_blocks_the_next_run(
    start_daemon: Start, hook_factory: Callable[[str], Hook], home: Path, tmp_path: Path
) -> None:
    """Run 1's alert hangs in the webhook; run 2 floods 200k lines through meanwhile, nothing lost, no secret leaked."""
    hung = hook_factory("hang")
    rate = tmp_path / "rate"
    daemon = start_daemon(
        child("crash_then_flood.py", "200000", str(rate)),
        restart={"early_retries": 1},
        alerts={"webhook_url": hung.url},
    )
    assert daemon.wait(120) == 0
    assert hung.hits >= 1  # the alert for run 1 was (and stayed) in flight during run 2
    lines = [r for r in daemon.records() if hasattr(r, "line") and r.run == 2]
    assert len(lines) == 200_000
    assert int(rate.read_text()) > 0
    state = (home / "state.json").read_text()
    assert "SECRETPATH" not in state
    assert all("SECRETPATH" not in json.dumps(getattr(r, "fields", {})) for r in daemon.records())


def test_crash_loop_alerts_through_the_webhook(
    start_daemon: Start, hook_factory: Callable[[str], Hook]
) -> None:
    """A crash loop posts the first early death and the fatal: two webhook posts, with alert records."""
    hook = hook_factory("ok")
    daemon = start_daemon(
        child("crash_early.py"),
        restart={"early_retries": 2, "backoff_initial_s": 0.05},
        alerts={"webhook_url": hook.url},
    )
    assert daemon.wait(60) == 4
    assert [b["verdict"] for b in hook.bodies] == ["crash_before_first_step", "fatal"]
    records = daemon.events("alert")
    assert [(r.fields["sink"], r.fields["ok"], r.fields["verdict"]) for r in records] == [
        ("webhook", True, "crash_before_first_step"),
        ("webhook", True, "fatal"),
    ]


def test_unfixable_failure_is_one_page(
    start_daemon: Start, hook_factory: Callable[[str], Hook]
) -> None:
    """An import error is fatal at once, with one alert: ``fatal``, carrying the run's tail."""
    hook = hook_factory("ok")
    daemon = start_daemon(child("import_error.py"), alerts={"webhook_url": hook.url})
    assert daemon.wait(60) == 4
    assert [(b["verdict"], b["reason"]) for b in hook.bodies] == [
        ("fatal", "unfixable_import_error")
    ]
    assert any("ModuleNotFoundError" in line for line in hook.bodies[0]["tail"])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_metrics_are_scraped_and_parsed(start_daemon: Start) -> None:
    """A real GET on metrics_listen returns Prometheus text that prometheus-client parses."""
    port = free_port()
    daemon = start_daemon(
        child("progress_then.py", "notify", "hang", "7"),
        metrics_listen=f"127.0.0.1:{port}",
        restart={"runtime_retries": 0},
    )
    daemon.wait_event("metrics_on")
    daemon.wait_event("first_step")
    deadline = time.monotonic() + 10
    families: dict[str, object] = {}
    while time.monotonic() < deadline:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        families = {f.name: f for f in text_string_to_metric_families(body)}
        step = families["dflashd_step"].samples[0].value  # type: ignore[attr-defined]
        if step == 7:
            break
        # The snapshot is republished at most once a second and a scrape is its only
        # observable: poll the endpoint itself (bounded by the deadline), there is no event.
        time.sleep(0.1)
    assert families["dflashd_step"].samples[0].value == 7  # type: ignore[attr-defined]
    states = {s.labels["state"]: s.value for s in families["dflashd_state"].samples}  # type: ignore[attr-defined]
    assert states["running"] == 1.0 and states["fatal"] == 0.0
    assert {
        "dflashd_run",
        "dflashd_seconds_since_progress",  # deprecated, kept one release
        "dflashd_last_progress_timestamp_seconds",
        "dflashd_build_info",
        "dflashd_restarts",
        "dflashd_log_written_bytes",
        "dflashd_gpu_memory_used_bytes",
        "dflashd_last_exit_timestamp_seconds",
    } <= families.keys()
    assert families["dflashd_log_written_bytes"].samples[0].value > 0  # type: ignore[attr-defined]
    # Counters exist from the first scrape, at 0 for every label value (rate() needs the series).
    restarts = {
        s.labels["verdict"]: s.value
        for s in families["dflashd_restarts"].samples
        if s.name.endswith("_total")
    }  # type: ignore[attr-defined]
    assert restarts["crashed"] == 0 and restarts["crash_before_first_step"] == 0
    alerts = {(s.labels["kind"], s.labels["ok"]) for s in families["dflashd_alerts"].samples}  # type: ignore[attr-defined]
    assert ("fatal", "false") in alerts and ("recovered", "true") in alerts
    assert families["dflashd_up"].samples[0].value == 1  # type: ignore[attr-defined]
    assert families["dflashd_info"].samples[0].labels["version"]  # type: ignore[attr-defined]
    # issue 44: the loss, the daemon's own process_* figures, a home label, /healthz
    up = families["dflashd_up"].samples[0]  # type: ignore[attr-defined]
    assert up.labels["home"] == str(daemon.home) and "node" in up.labels
    assert "process_cpu_seconds" in families and "process_resident_memory_bytes" in families
    assert families["dflashd_slow"].samples[0].value == 0  # type: ignore[attr-defined]
    health = urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5)
    assert health.status == 200 and health.read().decode() == "ok running\n"
