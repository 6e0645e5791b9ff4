"""The daemon's snapshot for status: built once per publish from the daemon's parts.

:func:`status_view` reads the loop's state, the run, the ledger, the GPU watch and the
reporter's counters, and fills in the :class:`~dflashd.supervisor.speak.statusview.StatusView`
contract, which sits below every module.  Nothing imports this module but the daemon.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

from dflashd.logs.linecodec import CODEC
from dflashd.supervisor import __version__
from dflashd.supervisor.host.clock import Clock
from dflashd.supervisor.host.config import Config
from dflashd.supervisor.host.home import Home
from dflashd.supervisor.host.processops import ProcessOps
from dflashd.supervisor.model.advice import AdviceInputs, checkpoint_cost, said
from dflashd.supervisor.model.deadlines import Deadlines
from dflashd.supervisor.model.goodput import Cost, RunTimes
from dflashd.supervisor.model.hang import HangWatch
from dflashd.supervisor.model.ledger import Ledger
from dflashd.supervisor.model.lifecycle import State
from dflashd.supervisor.model.recoveries import recovery_split
from dflashd.supervisor.model.runstate import RunState
from dflashd.supervisor.speak.reporter import Reporter
from dflashd.supervisor.speak.statusview import StatusView
from dflashd.supervisor.watch.gpuwatch import GpuWatch
from dflashd.supervisor.watch.placement import placement
from dflashd.supervisor.watch.run import Run
from dflashd.supervisor.watch.stackdumps import Dumper


class StatusSource(Protocol):
    """What the status view reads from the daemon."""

    clock: Clock
    started_wall: float
    gpu: GpuWatch
    reporter: Reporter
    home: Home
    config: Config
    boot_id: str | None
    ops: ProcessOps
    dumps: Dumper

    @property
    def ledger(self) -> Ledger:
        """The counters kept between runs."""
        ...

    @property
    def deadlines(self) -> Deadlines:
        """The loop's deadlines."""
        ...

    @property
    def state(self) -> State:
        """The daemon's state."""
        ...

    @property
    def hang_watch(self) -> HangWatch:
        """The current run's hang evidence (the model keeps it)."""
        ...

    @property
    def run(self) -> Run | None:
        """The current (or last) run."""
        ...

    def standby_view(self) -> dict[str, Any] | None:
        """The next run's waiting interpreter (warm_standby), or None."""
        ...


def status_view(source: StatusSource) -> StatusView:
    """Assemble the status object from the daemon's parts."""
    run, ledger = source.run, source.ledger
    now_mono, now_wall = source.clock.monotonic(), source.clock.time()
    alive = run is not None and run.alive
    facts = run.facts if run is not None else None
    progress = facts.progress if facts is not None else None
    times = facts.times() if alive and facts is not None else None
    age: float | None = None
    if facts is not None and progress is not None and alive:
        ref = progress.last_progress_mono or progress.last_alive_mono or facts.started_mono
        age = round(now_mono - ref, 3)
    restart_at = source.deadlines.restart_at or source.deadlines.release_check_at
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
        "loss_step": progress.loss_step if progress else None,
        "loss_unfinite": progress.loss_unfinite if progress else None,
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
        "gpu_method": facts.gpu_use.method if facts and facts.gpu_use else None,
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
        "restart_held_until": None if ledger.hold is None else ledger.hold.describe(),
        "log_stats": source.reporter.log_stats(),
        "node": source.config.node_name,
        "placement": placement(os.environ, source.config.command).fields(),
        "elastic": _elastic(run, ledger, now_mono),
        "custody": source.ops.mode,
        "standby": source.standby_view(),
        "stacks_tool": source.dumps.tool(),
        "log_codec": CODEC.implementation,
        "stop_timeout_s": source.config.restart.stop_timeout_s,
        "last_alert": source.reporter.last_alert,
        "goodput": ledger.goodput.view(times, now_mono),
        "waiting": source.hang_watch.waiting if alive else None,
        "pace": _pace(facts),
        "slow": _slow(facts, now_mono, now_wall) if alive else None,
        "diverged": dict(facts.diverged) if facts and facts.diverged else None,
        "checkpoint_advice": _advice(facts, times, ledger, now_mono),
        "recovery": _recovery(ledger, facts if alive else None, now_mono),
    }
    if alive and run is not None and run.pid is not None and facts is not None:
        view["child"] = {
            "pid": run.pid,
            "create_time": facts.create_time,
            "start_ticks": facts.start_ticks,
            "boot_id": source.boot_id,
        }
    return view


def _recovery(ledger: Ledger, run: RunState | None, now: float) -> dict[str, Any] | None:
    """The live run's recovery from the failure before it, split (model/recoveries.py)."""
    split = recovery_split(ledger.last_exit, run, now)
    return split.view() if split is not None else None


def _pace(run: RunState | None) -> dict[str, Any] | None:
    """The run's own step time (its baseline, once learnt) and its recent one."""
    pace = run.progress.pace if run is not None else None
    if pace is None or pace.baseline_s is None:
        return None
    ratio = pace.ratio
    recent = None if ratio is None else round(pace.baseline_s * ratio, 6)
    return {
        "baseline_step_s": round(pace.baseline_s, 6),
        "recent_step_s": recent,
        "ratio": None if ratio is None else round(ratio, 3),
        "lost_s": round(pace.lost_s, 3),
    }


def _slow(run: RunState | None, now_mono: float, now_wall: float) -> dict[str, Any] | None:
    """The open slow incident, with the wall time it opened."""
    if run is None or run.slow is None:
        return None
    out = {k: v for k, v in run.slow.items() if k not in ("since_mono", "dumps")}
    since = run.slow.get("since_mono")
    if isinstance(since, float):
        out["since"] = now_wall - (now_mono - since)
    return out


def _advice(
    run: RunState | None, times: RunTimes | None, ledger: Ledger, now_mono: float
) -> dict[str, Any] | None:
    """The checkpoint interval that pays (model/advice.py), when it differs much from today's."""
    total = ledger.goodput.settled(times, now_mono)
    return said(
        AdviceInputs(
            failures=sum(ledger.restarts_by_verdict.values()) + ledger.agent_restarts,
            working_s=total.total_s - total.stopped_s,
            recovery_s=total.startup_s + total.detection_s + total.downtime_s,
            redone_s=total.redone_s,
            checkpoint_cost_s=checkpoint_cost(run.progress.pace.pauses if run else ()),
        )
    )


def goodput_totals(source: StatusSource) -> tuple[Cost, int | None]:
    """The goodput ledger's settled totals now, and the best step a relaunch must pass."""
    run, book = source.run, source.ledger.goodput
    alive = run is not None and run.alive
    facts = run.facts if run is not None else None
    totals = book.settled(
        facts.times() if alive and facts is not None else None, source.clock.monotonic()
    )
    steps = (source.ledger.history.best_step, facts.progress.step if facts is not None else None)
    return totals, book.best_before(max((s for s in steps if s is not None), default=None))


def _elastic(run: Run | None, ledger: Ledger, now_mono: float) -> dict[str, Any] | None:
    """The torchrun agent's side of the run: this run's view, plus this daemon's totals."""
    agent = run.facts.agent if run is not None else None
    if run is None or agent is None:
        return None
    view = agent.view()
    since = agent.rendezvous_since
    waiting = run.alive and view["rendezvous"] == "waiting" and since is not None
    view["rendezvous_waiting_s"] = round(now_mono - since, 3) if waiting and since else None
    view["restarts_total"] = ledger.agent_restarts
    view["worker_failures_total"] = ledger.agent_worker_failures
    return view
