"""The status view: what ``dflashd status --json`` prints and state.json holds (docs/design.md, "Status").

:class:`StatusView` is the documented contract; :func:`status_view` builds it from the
daemon's rooms; :func:`parse_state` validates a state.json read back from disk (it is
input from outside: a hand-edited or corrupted file must never crash ``start`` or ``status``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, NotRequired, Protocol, TypedDict

from dflashd.supervisor import __version__
from dflashd.supervisor.run import Run

if TYPE_CHECKING:
    from dflashd.supervisor.aftermath import Ledger
    from dflashd.supervisor.clock import Clock
    from dflashd.supervisor.config import Config
    from dflashd.supervisor.gpuwatch import GpuWatch
    from dflashd.supervisor.groups import ProcessOps
    from dflashd.supervisor.home import Home
    from dflashd.supervisor.lifecycle import State
    from dflashd.supervisor.reporting import Reporter
    from dflashd.supervisor.timers import Timers


class ChildIdentity(TypedDict):
    """Enough to prove, after a daemon crash, that a process is the child this daemon ran."""

    pid: int
    create_time: float | None
    boot_id: str | None


class LogStats(TypedDict):
    """The run log's counters."""

    records_written: int
    bytes_written: int
    records_dropped: int
    bytes_dropped: int
    last_error: str | None


class StatusView(TypedDict):
    """One JSON object; every key is always present (``null`` when unknown)."""

    state: str  # starting | running | backoff | stopping | stopped | fatal
    phase: str  # launching | warming_up | training | exited
    pid: int  # the daemon's
    child_pid: int | None
    run: int | None
    step: int | None
    step_source: str | None  # notify | pattern | gpu | a built-in format's name
    first_step_source: str | None
    loss: float | None
    epoch: float | None  # epochs done, where the job's output says (a fraction where it can)
    child_status: str | None  # the child's last STATUS= (cleared when its run ends)
    last_line: str | None  # the job's last output line
    last_progress_age_s: float | None
    last_progress_at: float | None
    restarts: int  # all-time, across daemons
    restarts_by_verdict: dict[str, int]
    restarts_this_daemon: int
    last_exit: dict[str, Any] | None
    fatal_reason: str | None
    gpus: list[dict[str, Any]]
    gpu_checks: str
    gpu_method: str | None
    log: str
    home: str
    started_at: float
    uptime_s: float
    updated_at: float
    version: str
    command: list[str]
    cwd: str  # where the job runs (absolute)
    next_restart_in_s: float | None
    log_stats: LogStats
    node: str  # config "node", or the host name: this node's name in a larger job
    elastic: dict[str, Any] | None  # a torchrun job: its rendezvous and the restarts it handled
    custody: str  # how runs own their processes: "cgroup" or "pidfd"
    child: NotRequired[ChildIdentity]  # present while a child lives


class StatusSource(Protocol):
    """What the status view reads from the daemon."""

    state: State
    run: Run | None
    clock: Clock
    started_wall: float
    ledger: Ledger
    gpu: GpuWatch
    reporter: Reporter
    home: Home
    config: Config
    timers: Timers
    boot_id: str | None
    ops: ProcessOps


def status_view(source: StatusSource) -> StatusView:
    """Assemble the status object from the daemon's rooms."""
    run, ledger = source.run, source.ledger
    now_mono, now_wall = source.clock.monotonic(), source.clock.time()
    alive = run is not None and run.alive
    progress = run.progress if run is not None else None
    age: float | None = None
    if run is not None and progress is not None and alive:
        ref = progress.last_progress_mono or progress.last_alive_mono or run.started_mono
        age = round(now_mono - ref, 3)
    restart_at = source.timers.restart_at or source.timers.release_check_at
    view: StatusView = {
        "state": source.state.value,
        "phase": run.phase.value if run is not None else "launching",
        "pid": os.getpid(),
        "child_pid": run.pid if alive and run is not None else None,
        "run": run.run_no if run else None,
        "step": progress.step if progress else None,
        "step_source": progress.step_source if progress else None,
        "first_step_source": progress.first_step_source if progress else None,
        "loss": progress.loss if progress else None,
        "epoch": progress.epoch if progress else None,
        "child_status": progress.status_text if progress and alive else None,
        "last_line": progress.last_line if progress else None,
        "last_progress_age_s": age,
        "last_progress_at": None if age is None else now_wall - age,
        "restarts": sum(ledger.restarts_by_verdict.values()),
        "restarts_by_verdict": dict(ledger.restarts_by_verdict),
        "restarts_this_daemon": ledger.restarts_this_daemon,
        "last_exit": ledger.last_exit,
        "fatal_reason": ledger.fatal_reason,
        "gpus": list(source.gpu.last),
        "gpu_checks": source.gpu.status,
        "gpu_method": run.gpu_use.method if run is not None and run.gpu_use is not None else None,
        "log": str(source.reporter.log_path),
        "home": str(source.home.root),
        "started_at": source.started_wall,
        "uptime_s": round(now_wall - source.started_wall, 3),
        "updated_at": now_wall,
        "version": __version__,
        "command": list(source.config.command),
        "cwd": source.config.cwd,
        "next_restart_in_s": None
        if restart_at is None
        else round(max(0.0, restart_at - now_mono), 3),
        "log_stats": source.reporter.log_stats(),
        "node": source.config.node_name,
        "elastic": _elastic(run, ledger, now_mono),
        "custody": source.ops.mode,
    }
    if alive and run is not None and run.pid is not None:
        view["child"] = {"pid": run.pid, "create_time": run.create_time, "boot_id": source.boot_id}
    return view


def _elastic(run: Run | None, ledger: Ledger, now_mono: float) -> dict[str, Any] | None:
    """The torchrun agent's side of the run: this run's view, plus this daemon's totals."""
    if run is None or run.elastic is None:
        return None
    view = run.elastic.view()
    since = run.elastic.rendezvous_since
    waiting = run.alive and view["rendezvous"] == "waiting" and since is not None
    view["rendezvous_waiting_s"] = round(now_mono - since, 3) if waiting and since else None
    view["restarts_total"] = ledger.agent_restarts
    view["worker_failures_total"] = ledger.agent_worker_failures
    return view


def one_line(view: StatusView) -> str:
    """``running run 3 training step 1200``: systemd's STATUS= line, ``status`` in brief."""
    if view["run"] is None:
        return view["state"]
    step = f" step {view['step']}" if view["step"] is not None else ""
    return f"{view['state']} run {view['run']} {view['phase']}{step}"


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse_state(obj: Any) -> dict[str, Any]:
    """Keep only the well-typed parts of a state.json object; drop what is wrong, never raise.

    What a later daemon or ``status`` relies on is checked: ``run`` an integer,
    ``restarts_by_verdict`` a table of integers, ``last_exit`` an object, ``child`` an
    object with an integer pid, the strings strings.  Anything else is dropped.
    """
    if not isinstance(obj, dict):
        return {}
    out: dict[str, Any] = {}
    for key, value in obj.items():
        if not isinstance(key, str):
            continue
        out[key] = value
    run_no = _int(out.get("run"))
    if run_no is None or run_no < 0:
        out.pop("run", None)
    by_verdict = out.get("restarts_by_verdict")
    if isinstance(by_verdict, dict):
        out["restarts_by_verdict"] = {
            str(k): v for k, v in by_verdict.items() if _int(v) is not None and v >= 0
        }
    else:
        out.pop("restarts_by_verdict", None)
    for key in ("last_exit", "child", "log_stats"):
        if key in out and not isinstance(out[key], dict):
            out.pop(key)
    child = out.get("child")
    if isinstance(child, dict) and _int(child.get("pid")) is None:
        out.pop("child")
    for key in ("state", "phase", "child_status", "log", "home", "gpu_checks", "fatal_reason"):
        if key in out and not isinstance(out[key], str):
            out.pop(key)
    for key in ("gpus", "command"):
        if key in out and not isinstance(out[key], list):
            out.pop(key)
    gpus = out.get("gpus")
    if isinstance(gpus, list):
        out["gpus"] = [g for g in gpus if isinstance(g, dict)]
    last_exit = out.get("last_exit")
    if isinstance(last_exit, dict) and not isinstance(last_exit.get("tail", []), list):
        last_exit["tail"] = []
    return out
