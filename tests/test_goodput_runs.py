"""Goodput (issue 33) with real processes: what a SIGKILL cost, read from the log and status.

A job stepping every 0.1 s that checkpoints every 20 steps is SIGKILLed at step 50: its
relaunch resumes at 40 and redoes 10 steps (about 1 s).  Without a checkpoint the relaunch
redoes all 50.  The daemon itself SIGKILLed and started again goes on from its saved totals.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dflashd.logs import EventRecord
from dflashd.logs.records import parse_timestamp
from tests.conftest import Daemon, child, run_cli

Start = Callable[..., Daemon]
SLOW_BACKOFF = {"backoff_initial_s": 5.0, "backoff_max_s": 30.0}  # new progress skips it


def _status(home: Path) -> dict[str, Any]:
    out = run_cli("status", "--json", "--home", str(home))
    status: dict[str, Any] = json.loads(out.stdout)
    return status


def _ts(record: EventRecord) -> float:
    return parse_timestamp(record.ts)


def _consistent(goodput: dict[str, Any]) -> None:
    lost = goodput["lost_s"]
    assert set(goodput) == {"ratio", "wall_s", "stopped_s", "productive_s", "lost_s"}
    assert set(lost) == {"startup", "detection", "downtime", "redone", "slow"}
    parts = goodput["productive_s"] + goodput["stopped_s"] + sum(lost.values())
    assert parts == pytest.approx(goodput["wall_s"], abs=0.01)
    working = goodput["wall_s"] - goodput["stopped_s"]
    assert goodput["ratio"] == pytest.approx(goodput["productive_s"] / working, abs=1e-3)


def _two_runs(daemon: Daemon) -> tuple[list[EventRecord], list[EventRecord]]:
    assert daemon.wait(120) == 0
    exits, spawns = daemon.events("exit"), daemon.events("spawn")
    assert [e.fields["verdict"] for e in exits] == ["crashed", "completed"], exits
    assert exits[0].fields["signal"] == "SIGKILL" and exits[0].fields["step"] == 50
    return exits, spawns


def _matches_the_records(home: Path, exits: list[EventRecord], spawns: list[EventRecord]) -> None:
    """Each exit's startup is its first_step_after_s; the relaunch's downtime is the gap
    from the death to the spawn; status's totals are the sums."""
    for record in exits:
        cost = record.fields["cost"]
        assert cost["startup_s"] == pytest.approx(record.fields["first_step_after_s"], abs=0.01)
    downtime = spawns[1].fields["downtime_s"]
    assert downtime == pytest.approx(_ts(spawns[1]) - _ts(exits[0]), abs=0.25)
    assert downtime < 2.0  # new progress: no backoff, though backoff_initial_s is 5
    goodput = _status(home)["goodput"]
    _consistent(goodput)
    lost = goodput["lost_s"]
    startups = sum(e.fields["cost"]["startup_s"] for e in exits)
    assert lost["startup"] == pytest.approx(startups, abs=0.05)
    assert lost["redone"] == pytest.approx(exits[1].fields["cost"]["redone_s"], abs=0.01)
    assert lost["detection"] == pytest.approx(
        sum(e.fields["cost"].get("detection_s", 0.0) for e in exits), abs=0.01
    )
    assert lost["downtime"] >= downtime


def test_a_sigkill_after_a_checkpoint_costs_the_ten_steps_redone(
    start_daemon: Start, home: Path, tmp_path: Path
) -> None:
    job = child("checkpointed.py", str(tmp_path / "ckpt"), "0.1", "20", "50", "60")
    exits, spawns = _two_runs(start_daemon(job, restart=SLOW_BACKOFF))
    assert exits[0].fields["cost"].get("redone_s", 0.0) == 0.0  # the first run redid nothing
    redone = exits[1].fields["cost"]["redone_s"]
    assert redone == pytest.approx(10 * 0.1, rel=0.25)  # steps 41-50 again
    _matches_the_records(home, exits, spawns)


def test_a_relaunch_from_step_one_redoes_every_earlier_step(
    start_daemon: Start, home: Path
) -> None:
    job = child("checkpointed.py", "none", "0.05", "20", "50", "60")
    exits, spawns = _two_runs(start_daemon(job, restart=SLOW_BACKOFF))
    redone = exits[1].fields["cost"]["redone_s"]
    assert redone == pytest.approx(50 * 0.05, rel=0.25)
    _matches_the_records(home, exits, spawns)


def test_the_totals_come_back_after_the_daemon_is_sigkilled(
    start_daemon: Start, home: Path, tmp_path: Path
) -> None:
    job = child("checkpointed.py", str(tmp_path / "ckpt"), "0.1", "20", "50", "1000000")
    daemon = start_daemon(job)
    daemon.wait_for(
        lambda r: (
            isinstance(r, EventRecord)
            and r.event == "progress"
            and r.run == 2
            and (r.fields.get("step") or 0) >= 70
        ),
        timeout=60,
    )
    before = _status(home)
    daemon.proc.kill()  # SIGKILL: no goodbye, no last save
    daemon.proc.wait(10)
    # the next daemon runs a job that stays in its start-up: productive and redone hold still
    again = start_daemon(child("prints_then_waits.py"))
    again.wait_for(lambda r: isinstance(r, EventRecord) and r.event == "launched" and r.run == 3)
    after = _status(home)
    assert after["run"] == 3
    g1, g2 = before["goodput"], after["goodput"]
    _consistent(g2)
    saved_every = 2.0  # reporter.GOODPUT_SAVE_EVERY_S: what a SIGKILL may lose (as downtime)
    assert g1["productive_s"] - saved_every - 0.5 <= g2["productive_s"] <= g1["productive_s"] + 0.5
    assert g2["lost_s"]["redone"] == pytest.approx(g1["lost_s"]["redone"], abs=0.01)
    assert g2["lost_s"]["startup"] >= g1["lost_s"]["startup"]
    elapsed = after["updated_at"] - before["updated_at"]
    assert g2["wall_s"] == pytest.approx(g1["wall_s"] + elapsed, abs=1.0)  # no second unaccounted
    assert g2["lost_s"]["downtime"] > g1["lost_s"]["downtime"]  # the daemon's absence


def test_prometheus_serves_the_ledger(start_daemon: Start, tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    job = child("checkpointed.py", str(tmp_path / "ckpt"), "0.05", "20", "30", "1000000")
    daemon = start_daemon(job, metrics_listen=f"127.0.0.1:{port}")
    daemon.wait_for(
        lambda r: isinstance(r, EventRecord) and r.event == "progress" and r.run == 2, timeout=60
    )
    # the snapshot is republished once a second: scrape until it shows run 2's redone steps
    deadline = time.monotonic() + 10
    while True:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            body = resp.read().decode()
        samples = {
            (s.name, s.labels.get("cause", "")): s.value
            for f in text_string_to_metric_families(body)
            for s in f.samples
        }
        if samples.get(("dflashd_lost_seconds_total", "redone"), 0) > 0:
            break
        assert time.monotonic() < deadline, body
        time.sleep(0.2)
    assert samples[("dflashd_productive_seconds_total", "")] > 0
    for cause in ("startup", "detection", "downtime"):
        assert ("dflashd_lost_seconds_total", cause) in samples
    assert 0 < samples[("dflashd_goodput_ratio", "")] < 1
