"""Issue 55 (containers): dflashd as the first process of a PID namespace, and the shipped
Dockerfile and Kubernetes example checked for the fields a user gets wrong."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dflashd.logs import EventRecord, LineRecord, follow
from tests.conftest import dflashd_argv, write_config

ROOT = Path(__file__).resolve().parents[1]
# orphans: two that exit at once (zombies unless reaped) and one that outlives the job's shell
JOB = "(sleep 0.2 &); (sleep 0.2 &); (sleep 300 &); sleep 1; echo step 1; exec sleep 600"


def _zombies_under(pid: int) -> list[str]:
    """Every zombie among ``pid``'s descendants (host pids, from /proc)."""
    children: dict[int, list[int]] = {}
    states: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        states[int(entry.name)] = fields[0]
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if states.get(child) == "Z":
                found.append(str(child))
            todo.append(child)
    return found


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="a PID namespace needs root and unshare(1)",
)
def test_as_pid_1_it_reaps_every_orphan_and_takes_sigterm_as_stop(tmp_path: Path) -> None:
    home = tmp_path / "home"
    config = write_config(tmp_path / "c.toml", {"gpus": "none"})
    inner = dflashd_argv("start", "--foreground", "--quiet", "--home", str(home), "-c", str(config))
    argv = ["unshare", "--pid", "--fork", "--mount-proc", *inner, "--", "sh", "-c", JOB]
    outer = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        (home / "logs").mkdir(parents=True, exist_ok=True)
        for record in follow(home / "logs", poll_s=0.05):  # the job's own line: it runs
            if isinstance(record, LineRecord) and record.line == "step 1":
                break
        daemon = int(Path(f"/proc/{outer.pid}/task/{outer.pid}/children").read_text().split()[0])
        ns_pids = [line for line in Path(f"/proc/{daemon}/status").read_text().splitlines()]
        assert any(line.startswith("NSpid:") and line.split()[-1] == "1" for line in ns_pids)
        assert _zombies_under(daemon) == []  # the two short-lived orphans were reaped
        os.kill(daemon, signal.SIGTERM)  # what `docker stop` and the kubelet send
        assert outer.wait(60) == 0  # stopped: exit 0, within the grace
    finally:
        if outer.poll() is None:
            outer.kill()
            outer.wait()
    events = [
        r for r in follow(home / "logs", should_stop=lambda: True) if isinstance(r, EventRecord)
    ]
    ends = [e.fields.get("verdict") for e in events if e.event == "exit"]
    assert ends == ["stopped"], ends
    assert any(e.event == "daemon_exit" for e in events)


def _instructions(path: Path) -> list[tuple[str, str]]:
    """A Dockerfile's instructions (continuation lines joined, comments left out)."""
    joined = path.read_text().replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_the_dockerfile_runs_dflashd_as_pid_1_with_torch_installed_first() -> None:
    steps = _instructions(ROOT / "deploy" / "Dockerfile")
    words = [w for w, _ in steps]
    assert steps[0][0] == "FROM" and steps[0][1].startswith("nvidia/cuda:")
    entry = json.loads(dict(steps)["ENTRYPOINT"])  # the exec form: dflashd is PID 1, no shell
    assert entry == ["dflashd", "start", "--foreground", "--"]
    assert dict(steps)["STOPSIGNAL"] == "SIGTERM"
    runs = [rest for word, rest in steps if word == "RUN"]
    torch_at = next(i for i, r in enumerate(runs) if "install" in r and "torch" in r)
    dflashd_at = next(i for i, r in enumerate(runs) if "[trainer]" in r)
    assert torch_at < dflashd_at  # never a surprise torch of dflashd's choosing
    assert "COPY" in words and "CMD" in words


def test_the_kubernetes_example_probes_the_port_dflashd_serves_and_outlasts_its_stop() -> None:
    yaml = pytest.importorskip("yaml")
    docs = list(yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "jobset.yaml").read_text()))
    config_map = next(d for d in docs if d["kind"] == "ConfigMap")
    config = tomllib.loads(config_map["data"]["dflashd.toml"])
    port = int(config["metrics_listen"].rsplit(":", 1)[1])
    assert not config["metrics_listen"].startswith("127."), "the kubelet probes from outside"
    jobset = next(d for d in docs if d["kind"] == "JobSet")
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    probe = container["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz" and int(probe["port"]) == port
    assert container["command"][:3] == ["dflashd", "start", "--foreground"]
    stop_s = float(config.get("restart", {}).get("stop_timeout_s", 30.0))
    assert pod["terminationGracePeriodSeconds"] > stop_s  # the kubelet's SIGKILL comes last
    assert container["livenessProbe"]["timeoutSeconds"] >= 2
    mounted = {m["mountPath"] for m in container["volumeMounts"]}
    flag = container["command"].index("--config") + 1
    assert str(Path(container["command"][flag]).parent) in mounted


def test_healthz_is_unhealthy_only_when_the_daemons_loop_stops_reading_its_inbox() -> None:
    """Issue 55: a liveness probe on /healthz restarts a stuck daemon, never a slow job. The
    health check pings the loop through its inbox (no periodic wake-up): answered, healthy;
    unanswered for STUCK_S, 503."""
    import socket
    import threading
    import time
    import urllib.error
    import urllib.request

    from dflashd.supervisor.inbox import Inbox
    from dflashd.supervisor.speak.metrics import STUCK_S, MetricsServer

    inbox = Inbox()
    extra = {"log_written_bytes": 0.0, "log_dropped_bytes": 0.0}
    with socket.socket() as probe:  # a free port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = MetricsServer(
        f"127.0.0.1:{port}", lambda: {"state": "running"}, lambda: extra, inbox.ping
    )
    try:
        assert server.loop_silent_s(100.0) == 0.0  # a ping sent
        assert server.loop_silent_s(120.0) == 20.0  # not read yet: the loop is silent 20 s
        assert list(inbox.messages()) == []  # the loop turns: the ping answered, never yielded
        assert server.loop_silent_s(140.0) == 0.0
        server._pinged = None  # the real clock from here on
        server.start()
        url = f"http://127.0.0.1:{server.port}/healthz"
        assert urllib.request.urlopen(url, timeout=5).read() == b"ok running\n"
        server._pinged = (threading.Event(), time.monotonic() - STUCK_S - 1)  # a stuck loop
        try:
            urllib.request.urlopen(url, timeout=5)
            raise AssertionError("a stuck loop answered healthy")
        except urllib.error.HTTPError as exc:
            assert exc.code == 503 and b"stuck" in exc.read()
    finally:
        server.stop()
        inbox.close()


def test_a_job_is_placed_by_slurm_else_by_torchrun_and_labels_every_series() -> None:
    """Issue 55 (fleet view): one PromQL query shows a job across its nodes, whatever launched
    it: Slurm's ids first, torchrun's rendezvous id and node rank next."""
    from dflashd.supervisor.host.home import slurm_home_name
    from dflashd.supervisor.speak.metrics import labelled_by_node, metric_families
    from dflashd.supervisor.watch.placement import placement

    torchrun = ["torchrun", "--nnodes=2", "--rdzv-id", "llm-7", "--node-rank=1", "train.py"]
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_NODEID": "1", "SLURM_STEP_ID": "0"}
    placed = placement(slurm, torchrun)
    assert (placed.job, placed.rank, placed.step, placed.scheduler) == ("4242", "1", "0", "slurm")
    alone = placement({}, torchrun)
    assert (alone.job, alone.rank, alone.scheduler) == ("llm-7", "1", "torchrun")
    assert placement({}, ["python", "train.py"]).fields() is None
    assert slurm_home_name(slurm) == "dflashd-slurm-4242-node1"
    assert slurm_home_name({}) is None and slurm_home_name({"SLURM_JOB_ID": "../x"}) is None
    extra = {"log_written_bytes": 0.0, "log_dropped_bytes": 0.0}
    snapshot = {"state": "running", "placement": placed.fields()}
    families = labelled_by_node(metric_families(snapshot, extra, 0.0), "gpu-a", "/h", "4242", "1")
    for family in families:
        for sample in family.samples:
            assert sample.labels["job"] == "4242" and sample.labels["rank"] == "1", sample
            assert sample.labels["node"] == "gpu-a" and sample.labels["home"] == "/h"


def test_inside_a_slurm_job_the_default_home_is_the_jobs(tmp_path: Path) -> None:
    """Two Slurm jobs on one node (or two nodes of one job on a shared home directory) never
    share a home: status and the log land in ``dflashd-slurm-<job>-node<N>``."""
    import tempfile

    with tempfile.TemporaryDirectory(dir="/tmp") as short:  # sockets' paths: 107 bytes at most
        env = {**os.environ, "XDG_STATE_HOME": short, "SLURM_JOB_ID": "77", "SLURM_NODEID": "0"}
        env.pop("DFLASHD_HOME", None)
        config = write_config(tmp_path / "c.toml", {"gpus": "none"})
        argv = dflashd_argv("start", "--foreground", "--quiet", "-c", str(config), "--", "true")
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        home = Path(short) / "dflashd-slurm-77-node0"
        state = json.loads((home / "state.json").read_text())
        assert state["placement"] == {"job": "77", "rank": "0", "scheduler": "slurm"}, state


def _exported_names() -> set[str]:
    """Every series name dflashd serves, from a snapshot with every part filled in."""
    from dflashd.supervisor.speak.metrics import metric_families

    snapshot = {
        "state": "running",
        "phase": "training",
        "run": 3,
        "step": 120,
        "loss": 0.5,
        "last_progress_at": 1.0,
        "child_pid": 7,
        "last_exit": {"ended_at": 1.0, "verdict": "crashed", "reason": "x"},
        "gpus": [
            {
                "index": 0,
                "memory_used_mib": 1,
                "memory_total_mib": 2,
                "utilization_pct": 3,
                "child_memory_mib": 1,
            }
        ],
        "pace": {"baseline_step_s": 0.1, "recent_step_s": 0.2},
        "elastic": {"restarts_total": 1, "worker_failures_total": 1, "rendezvous_waiting_s": 0.0},
        "goodput": {
            "ratio": 0.9,
            "wall_s": 10,
            "stopped_s": 0,
            "productive_s": 9,
            "lost_s": {"startup": 1, "detection": 0, "downtime": 0, "redone": 0, "slow": 0},
        },
        "recovery": {
            "start": "warm",
            "detection_s": 1.0,
            "teardown_s": 0.1,
            "start_s": 0.5,
            "redone_s": 1.0,
            "redone_steps": 3,
        },
    }
    extra = {"log_written_bytes": 0.0, "log_dropped_bytes": 0.0}
    names = {"up"}  # Prometheus' own, per target
    for family in metric_families(snapshot, extra, 2.0):
        names |= {sample.name for sample in family.samples} | {family.name}
    return names


def test_every_query_of_the_dashboard_and_the_rules_names_a_metric_dflashd_serves() -> None:
    import re

    yaml = pytest.importorskip("yaml")
    exported = _exported_names()
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "dflashd-job.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    rules = yaml.safe_load((ROOT / "systemd" / "dflashd-alerts.rules.yml").read_text())
    exprs += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    named = {n for e in exprs for n in re.findall(r"\b(dflashd_[a-z_]+)", e)}
    assert named and named <= exported, sorted(named - exported)
    assert dashboard["uid"] and all(
        p["datasource"]["uid"] == "${datasource}" for p in dashboard["panels"]
    )
    per_job = [e for e in exprs[: len(dashboard["panels"])] if 'job="$job"' not in e]
    assert per_job == [], per_job  # every panel is one job's, across its nodes


def test_grafanas_own_sdk_loads_the_dashboard_into_its_panel_and_query_types() -> None:
    """Issue 55: the dashboard as Grafana's foundation SDK decodes it: every panel's options are
    the options of the plugin its type names (a misspelt type or plugin stays a bare dict),
    every query a Prometheus one with an expression, and it goes back to JSON whole."""
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models import dashboard, prometheus

    register_default_plugins()
    data = json.loads((ROOT / "deploy" / "grafana" / "dflashd-job.json").read_text())
    loaded = dashboard.Dashboard.from_json(data)
    assert loaded.panels is not None and len(loaded.panels) == len(data["panels"]) >= 8
    for panel in loaded.panels:
        assert isinstance(panel, dashboard.Panel), panel
        plugin = type(panel.options).__module__.rsplit(".", 1)[-1]
        assert plugin == panel.type_val, (panel.title, panel.type_val, type(panel.options))
        assert panel.targets and all(
            isinstance(t, prometheus.Dataquery) and t.expr for t in panel.targets
        ), panel.title
    again = loaded.to_json()
    assert again["uid"] == data["uid"] and len(again["panels"]) == len(data["panels"])


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool not installed (apt-get install prometheus)"
)
def test_the_alert_rules_pass_promtools_own_tests() -> None:
    """A node not training while the others of its job do, and no step anywhere: promtool's
    rule tests on synthetic series (tests/promtool/rules_test.yml)."""
    checked = subprocess.run(
        ["promtool", "check", "rules", "systemd/dflashd-alerts.rules.yml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        ["promtool", "test", "rules", "rules_test.yml"],
        cwd=ROOT / "tests" / "promtool",
        capture_output=True,
        text=True,
    )
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool not installed (apt-get install prometheus)"
)
def test_a_live_scrape_passes_promtools_metric_lint_and_serves_every_queried_series(
    start_daemon: Callable[..., Any],
) -> None:
    """Issue 55: a real daemon's /metrics, scraped live, as promtool lints it (names, types,
    help, units), and every series the dashboard and the rules query is in it."""
    import re
    import urllib.request

    from tests.conftest import child
    from tests.test_alerts_metrics import free_port

    yaml = pytest.importorskip("yaml")
    port = free_port()
    daemon = start_daemon(
        child("progress_then.py", "notify", "hang", "7"), metrics_listen=f"127.0.0.1:{port}"
    )
    daemon.wait_event("metrics_on")
    daemon.wait_event("first_step")
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    linted = subprocess.run(
        ["promtool", "check", "metrics"], input=body, capture_output=True, check=False
    )
    assert linted.returncode == 0, (linted.stdout + linted.stderr).decode()
    families = set(re.findall(rb"^# TYPE (dflashd_[a-z_]+) ", body, re.M))
    served = set(re.findall(rb"^(dflashd_[a-z_]+)", body, re.M)) | {
        f + suffix for f in families for suffix in (b"", b"_bucket", b"_sum", b"_count", b"_total")
    }
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "dflashd-job.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    rules = yaml.safe_load((ROOT / "systemd" / "dflashd-alerts.rules.yml").read_text())
    exprs += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    queried = {n.encode() for e in exprs for n in re.findall(r"\b(dflashd_[a-z_]+)", e)}
    # served only once there is something to say: a torchrun job's agent and rendezvous, a
    # relaunch's recovery, a pace learnt (the exporter's full snapshot above covers them)
    later = {
        b"dflashd_agent_restarts_total",
        b"dflashd_rendezvous_waiting_seconds",
        b"dflashd_recovery_seconds",
        b"dflashd_step_seconds",
    }
    assert queried and queried - later <= served, sorted(queried - later - served)
