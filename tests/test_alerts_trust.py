"""Alerts a person can trust (issue 34), with real daemons, real children and a real webhook.

One stuck job is one incident: ``stalled`` once, never a false ``recovered``, then ``fatal``.
A launch that fails says the OS error; the fatal that follows an early death names it
(``run_verdict``); a delivery that failed shows in ``status``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import Daemon, child, run_cli
from tests.test_alerts_metrics import Hook, hook_factory

__all__ = ["hook_factory"]  # the fixture, shared with tests/test_alerts_metrics.py

Start = Callable[..., Daemon]


def _status(home: Path) -> tuple[dict[str, Any], str]:
    as_json = json.loads(run_cli("status", "--json", "--home", str(home)).stdout)
    return as_json, run_cli("status", "--home", str(home)).stdout


def test_one_stuck_job_is_one_alert_then_the_fatal(
    start_daemon: Start, hook_factory: Callable[[str], Hook]
) -> None:
    hook = hook_factory("ok")
    daemon = start_daemon(
        child("stuck_at_three.py"),
        stall_timeout_s=2,
        restart={"no_progress_restarts": 2},
        alerts={"webhook_url": hook.url},
    )
    assert daemon.wait(90) == 4
    verdicts = [e.fields["verdict"] for e in daemon.events("exit")]
    assert verdicts == ["stalled", "stalled", "stalled"]
    assert [(b["verdict"], b["reason"]) for b in hook.bodies] == [
        ("stalled", "no_progress"),
        ("fatal", "no_progress_past_step_3"),
    ]
    assert hook.bodies[1]["run_verdict"] == "stalled"


def test_a_failed_launch_says_the_os_error_everywhere(
    start_daemon: Start, home: Path, hook_factory: Callable[[str], Hook]
) -> None:
    hook = hook_factory("ok")
    daemon = start_daemon(["pyhton-not-here", "train.py"], alerts={"webhook_url": hook.url})
    assert daemon.wait(30) == 4
    (exit_record,) = daemon.events("exit")
    assert "No such file or directory" in exit_record.fields["error"]
    (body,) = hook.bodies
    assert "No such file or directory" in body["error"] and "pyhton-not-here" in body["error"]
    assert "spawn failed: " in body["text"] and "no exit status" not in body["text"]
    status, text = _status(home)
    assert "No such file or directory" in status["last_exit"]["error"]
    assert "spawn failed: " in text and "pyhton-not-here" in text
    assert re.search(r"^custody\s+(cgroup|pidfd|pid)$", text, re.M)  # as the README says


def test_the_fatal_after_an_import_error_names_the_early_death(
    start_daemon: Start, hook_factory: Callable[[str], Hook]
) -> None:
    hook = hook_factory("ok")
    daemon = start_daemon(child("import_error.py"), alerts={"webhook_url": hook.url})
    assert daemon.wait(60) == 4
    (body,) = hook.bodies
    assert (body["verdict"], body["reason"]) == ("fatal", "unfixable_import_error")
    assert body["run_verdict"] == "crash_before_first_step"


def test_a_failed_delivery_shows_in_status(
    start_daemon: Start, home: Path, hook_factory: Callable[[str], Hook]
) -> None:
    hook = hook_factory("500")
    daemon = start_daemon(child("import_error.py"), alerts={"webhook_url": hook.url})
    assert daemon.wait(60) == 4
    status, text = _status(home)
    alert = status["last_alert"]
    assert (alert["kind"], alert["run"]) == ("fatal", 1)
    webhook = alert["sinks"]["webhook"]
    assert webhook["ok"] is False and "HTTP 500" in webhook["detail"]
    assert "SECRETPATH" not in json.dumps(status)  # the URL's path is the secret
    assert "last alert" in text and "webhook FAILED (HTTP 500" in text
