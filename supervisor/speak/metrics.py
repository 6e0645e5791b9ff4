"""Prometheus metrics on an opt-in ``metrics_listen`` address (loopback unless told otherwise).

prometheus-client is imported only when metrics are on, so the daemon stays small without
them.  Scrapes never touch the daemon's loop: they read the last status snapshot the loop
published (replaced whole, never mutated) plus the log sink's counters.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final

from dflashd.supervisor import __version__
from dflashd.supervisor.host.config import parse_listen
from dflashd.supervisor.model.goodput import GoodputView, lost_seconds, view_from_json
from dflashd.supervisor.model.lifecycle import Phase, State
from dflashd.supervisor.model.rules import ALL_ALERT_KINDS
from dflashd.supervisor.model.verdicts import Verdict

_MIB: Final = 1024 * 1024
STUCK_S: Final = 30.0  # /healthz: a loop silent this long is stuck (a liveness probe restarts it)


def metric_families(snapshot: dict[str, Any], extra: dict[str, Any], now: float) -> Iterator[Any]:
    """The metric families for one scrape, from a status snapshot (pure apart from the import)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    state = GaugeMetricFamily("dflashd_state", "1 for the daemon's current state", labels=["state"])
    for value in State:
        state.add_metric([value.value], 1.0 if snapshot.get("state") == value.value else 0.0)
    yield state
    phase = GaugeMetricFamily("dflashd_phase", "1 for the current run's phase", labels=["phase"])
    for phase_value in Phase:
        phase.add_metric(
            [phase_value.value], 1.0 if snapshot.get("phase") == phase_value.value else 0.0
        )
    yield phase
    yield GaugeMetricFamily(
        "dflashd_run", "Current run number", value=float(snapshot.get("run") or 0)
    )
    yield GaugeMetricFamily(
        "dflashd_step", "Last step the job reported", value=float(snapshot.get("step") or 0)
    )
    progress_at = snapshot.get("last_progress_at")
    last = GaugeMetricFamily(
        "dflashd_last_progress_timestamp_seconds",
        "When the job last made progress (Unix time; rules compute the age with time())",
    )
    # Deprecated name, kept for one release: dashboards move to the timestamp above.
    since = GaugeMetricFamily(
        "dflashd_seconds_since_progress",
        "Deprecated (use dflashd_last_progress_timestamp_seconds): seconds since progress",
    )
    if isinstance(progress_at, int | float) and snapshot.get("child_pid"):
        last.add_metric([], float(progress_at))
        since.add_metric([], max(0.0, now - progress_at))
    yield last
    yield since
    restarts = CounterMetricFamily(
        "dflashd_restarts", "Relaunches, by the verdict that caused them", labels=["verdict"]
    )
    # Every verdict from the first scrape, at 0: rate() and absence alerts need the series.
    counts = {v.value: 0.0 for v in Verdict} | {
        str(k): float(v) for k, v in (snapshot.get("restarts_by_verdict") or {}).items()
    }
    for name, count in sorted(counts.items()):
        restarts.add_metric([name], count)
    yield restarts
    last_exit = snapshot.get("last_exit") or {}
    ended = GaugeMetricFamily(
        "dflashd_last_exit_timestamp_seconds", "When the last run ended (Unix time)"
    )
    if isinstance(last_exit.get("ended_at"), int | float):
        ended.add_metric([], float(last_exit["ended_at"]))
    yield ended
    verdict = GaugeMetricFamily(
        "dflashd_last_exit_verdict",
        "1 for the verdict of the last run that ended",
        labels=["verdict", "reason"],
    )
    if last_exit.get("verdict"):
        verdict.add_metric([str(last_exit["verdict"]), str(last_exit.get("reason") or "")], 1.0)
    yield verdict
    used = GaugeMetricFamily("dflashd_gpu_memory_used_bytes", "GPU memory used", labels=["gpu"])
    total = GaugeMetricFamily("dflashd_gpu_memory_total_bytes", "GPU memory total", labels=["gpu"])
    util = GaugeMetricFamily(
        "dflashd_gpu_utilization_ratio", "GPU utilisation (0-1)", labels=["gpu"]
    )
    child = GaugeMetricFamily(
        "dflashd_gpu_child_memory_bytes", "GPU memory held by the job", labels=["gpu"]
    )
    for gpu in snapshot.get("gpus") or []:
        label = [str(gpu.get("index"))]
        if gpu.get("memory_used_mib") is not None:
            used.add_metric(label, float(gpu["memory_used_mib"]) * _MIB)
        if gpu.get("memory_total_mib") is not None:
            total.add_metric(label, float(gpu["memory_total_mib"]) * _MIB)
        if gpu.get("utilization_pct") is not None:
            util.add_metric(label, float(gpu["utilization_pct"]) / 100.0)
        if gpu.get("child_memory_mib") is not None:
            child.add_metric(label, float(gpu["child_memory_mib"]) * _MIB)
    yield from (used, total, util, child)
    yield CounterMetricFamily(
        "dflashd_log_written_bytes",
        "Bytes written to the run log",
        value=extra["log_written_bytes"],
    )
    yield CounterMetricFamily(
        "dflashd_log_dropped_bytes",
        "Log bytes lost to a failing disk",
        value=extra["log_dropped_bytes"],
    )
    alerts = CounterMetricFamily(
        "dflashd_alerts", "Alert deliveries attempted, by kind and outcome", labels=["kind", "ok"]
    )
    sent = extra.get("alerts_by_kind") or {}
    for kind in ALL_ALERT_KINDS:
        for ok in ("true", "false"):
            alerts.add_metric([kind.value, ok], float(sent.get(f"{kind.value}:{ok}", 0.0)))
    yield alerts
    yield CounterMetricFamily(
        "dflashd_stack_dumps",
        "Stack dumps of the live run taken (dflashd stacks, and before each kill)",
        value=extra.get("stack_dumps", 0.0),
    )
    yield from _training_families(snapshot)
    yield from _elastic_families(snapshot.get("elastic"))
    yield from _goodput_families(view_from_json(snapshot.get("goodput")))
    yield from _recovery_families(snapshot.get("recovery"))
    version = str(snapshot.get("version") or __version__)
    build = GaugeMetricFamily("dflashd_build_info", "dflashd's version", labels=["version"])
    build.add_metric([version], 1.0)
    yield build
    info = GaugeMetricFamily(  # deprecated name, kept for one release
        "dflashd_info", "Deprecated (use dflashd_build_info): dflashd's version", labels=["version"]
    )
    info.add_metric([version], 1.0)
    yield info
    yield GaugeMetricFamily("dflashd_up", "1 while the daemon serves its loop", value=1.0)


def labelled_by_node(
    families: Iterable[Any], node: str, home: str = "", job: str = "", rank: str = ""
) -> Iterator[Any]:
    """Every series labelled ``job``, ``node``, ``rank`` and ``home``: one query shows a job
    across its nodes, and two homes on one node stay apart (watch/placement.py)."""
    where = {"job": job, "node": node, "rank": rank, "home": home}
    for family in families:
        family.samples = [s._replace(labels={**s.labels, **where}) for s in family.samples]
        yield family


def _training_families(snapshot: dict[str, Any]) -> Iterator[Any]:
    """The job's loss, its pace against its own baseline, an open slow incident, a divergence."""
    from prometheus_client.core import GaugeMetricFamily

    loss = snapshot.get("loss")
    if isinstance(loss, int | float) and not isinstance(loss, bool):
        yield GaugeMetricFamily("dflashd_loss", "The job's last logged loss", value=float(loss))
    pace = snapshot.get("pace")
    if isinstance(pace, dict):
        step = GaugeMetricFamily(
            "dflashd_step_seconds",
            "Seconds per step: the run's own baseline, and its recent median",
            labels=["which"],
        )
        for which in ("baseline", "recent"):
            value = pace.get(f"{which}_step_s")
            if isinstance(value, int | float):
                step.add_metric([which], float(value))
        yield step
    yield GaugeMetricFamily(
        "dflashd_slow", "1 while a slow incident is open", value=float(bool(snapshot.get("slow")))
    )
    yield GaugeMetricFamily(
        "dflashd_diverged",
        "1 once the run's loss diverged",
        value=float(bool(snapshot.get("diverged"))),
    )


def _elastic_families(elastic: dict[str, Any] | None) -> Iterator[Any]:
    """A torchrun job's agent: restarts it handled itself, and how long it waits for its peers."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    if elastic is None:
        return
    yield CounterMetricFamily(
        "dflashd_agent_restarts",
        "Worker-group restarts torchrun's agent made itself (this daemon's lifetime)",
        value=float(elastic.get("restarts_total") or 0),
    )
    yield CounterMetricFamily(
        "dflashd_agent_worker_failures",
        "Worker failures torchrun's agent reported (this daemon's lifetime)",
        value=float(elastic.get("worker_failures_total") or 0),
    )
    yield GaugeMetricFamily(
        "dflashd_rendezvous_waiting_seconds",
        "How long the agent has been waiting for its peers (0 when not waiting)",
        value=float(elastic.get("rendezvous_waiting_s") or 0.0),
    )


def _goodput_families(view: GoodputView | None) -> Iterator[Any]:
    """Where the job's time went (goodput.py): counters that only grow, and their ratio."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    if view is None:
        return
    yield CounterMetricFamily(
        "dflashd_productive_seconds",
        "Seconds the job made new progress (steps beyond any earlier run's best)",
        value=view["productive_s"],
    )
    lost = CounterMetricFamily(
        "dflashd_lost_seconds",
        "Seconds lost, by cause: startup, detection, downtime, redone",
        labels=["cause"],
    )
    for cause, seconds in lost_seconds(view).items():
        lost.add_metric([cause], seconds)
    yield lost
    yield CounterMetricFamily(
        "dflashd_stopped_seconds",
        "Seconds nobody wanted the job to run (stopped, completed, fatal until the next start)",
        value=view["stopped_s"],
    )
    ratio = GaugeMetricFamily(
        "dflashd_goodput_ratio", "Productive seconds over the wall time not stopped (0-1)"
    )
    if view["ratio"] is not None:
        ratio.add_metric([], view["ratio"])
    yield ratio


def _recovery_families(recovery: Any) -> Iterator[Any]:
    """The live run's recovery, split (model/recoveries.py): what the decision, the teardown,
    a warm or cold start and the redone steps each cost."""
    from prometheus_client.core import GaugeMetricFamily

    if not isinstance(recovery, dict):
        return
    parts = GaugeMetricFamily(
        "dflashd_recovery_seconds",
        "The live run's recovery from the failure before it, by part"
        " (detection, teardown, start, redone; start is labelled warm or cold)",
        labels=["part", "start"],
    )
    start = str(recovery.get("start") or "cold")
    for part in ("detection", "teardown", "start", "redone"):
        value = recovery.get(f"{part}_s")
        if isinstance(value, int | float) and not isinstance(value, bool):
            parts.add_metric([part, start], float(value))
    yield parts
    steps = recovery.get("redone_steps")
    if isinstance(steps, int) and not isinstance(steps, bool):
        yield GaugeMetricFamily(
            "dflashd_recovery_redone_steps",
            "Steps the live run did again up to the best before its failure",
            value=float(steps),
        )


class MetricsServer:
    """An HTTP endpoint serving :func:`metric_families` from its own registry."""

    def __init__(
        self,
        listen: str,
        snapshot: Callable[[], dict[str, Any]],
        extra: Callable[[], dict[str, Any]],
        ping: Callable[[], threading.Event] | None = None,
    ) -> None:
        self.host, self.port = parse_listen(listen)
        self._snapshot = snapshot
        self._extra = extra
        self._ping = ping  # the loop's inbox: an event it sets when it next turns
        self._pinged: tuple[threading.Event, float] | None = None
        self._server: Any = None

    def loop_silent_s(self, now: float) -> float:
        """How long the loop has left a ping unanswered (0 when it answers): each health check
        sends one when the last was answered, so a stuck loop is seen without a periodic wake."""
        if self._ping is None:
            return 0.0
        if self._pinged is None or self._pinged[0].is_set():
            self._pinged = (self._ping(), now)
            return 0.0
        return now - self._pinged[1]

    def collect(self) -> Iterator[Any]:
        """prometheus-client's collector interface."""
        snapshot = self._snapshot()
        families = metric_families(snapshot, self._extra(), time.time())
        node, home = str(snapshot.get("node") or ""), str(snapshot.get("home") or "")
        placed = snapshot.get("placement")
        placed = placed if isinstance(placed, dict) else {}
        job, rank = str(placed.get("job") or ""), str(placed.get("rank") or "")
        yield from labelled_by_node(families, node, home, job, rank)

    def start(self) -> None:
        """Bind and serve on one daemon thread (raises OSError when the address is taken)."""
        from prometheus_client import (
            CONTENT_TYPE_LATEST,
            CollectorRegistry,
            ProcessCollector,
            generate_latest,
        )

        from dflashd.supervisor.speak.httpserve import BoundedHttpServer

        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        ProcessCollector(registry=registry)  # the daemon's own process_* (CPU, memory, fds)

        def page() -> tuple[bytes, str, int]:
            return generate_latest(registry), CONTENT_TYPE_LATEST, 200

        def healthz() -> tuple[bytes, str, int]:
            # unhealthy only when the daemon itself is stuck (its loop has not read its inbox
            # for STUCK_S), never because the job is slow, hung or dead: the daemon handles those
            state = str(self._snapshot().get("state") or "starting")
            silent = self.loop_silent_s(time.monotonic())
            if silent > STUCK_S:
                text = f"stuck: the daemon's loop has not turned for {silent:.0f}s\n"
                return text.encode(), "text/plain; charset=utf-8", 503
            return f"ok {state}\n".encode(), "text/plain; charset=utf-8", 200

        pages = {"/metrics": page, "/": page, "/healthz": healthz}
        self._server = BoundedHttpServer(self.host, self.port, pages)
        self.port = self._server.port

    def stop(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.stop()
            self._server = None
