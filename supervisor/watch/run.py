"""One run: a launch of the job, from ``spawn`` to ``exit`` (in the spirit of Supervisor's process.py).

A :class:`Run` holds what the daemon knows about one child: its number (``run_no``), its
phase, its pipes, its progress and its GPU evidence.  ``alive`` and ``belongs(pid)`` are
the two questions the rest of the daemon asks of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from dflashd.logs.drain import PipeDrain
from dflashd.supervisor.host.proof import Launched, RunCustody
from dflashd.supervisor.model.goodput import RunTimes
from dflashd.supervisor.model.gpuspin import PowerSeen
from dflashd.supervisor.model.hang import Finding, HangWatch
from dflashd.supervisor.model.lifecycle import Phase
from dflashd.supervisor.model.stacks import StacksDump
from dflashd.supervisor.model.verdicts import AlertKind, EndedBy
from dflashd.supervisor.model.world import WAITING, WORKING, Share, share_of
from dflashd.supervisor.watch.elastic import ElasticState
from dflashd.supervisor.watch.nvml import ChildGpuUse
from dflashd.supervisor.watch.progress import Progress
from dflashd.supervisor.watch.slowness import PaceEvidence


class StepWatcher(Protocol):
    """The drains' callback as the loop sees it (:class:`~dflashd.supervisor.watch.linewatch.LineWatcher`)."""

    def due(self) -> float | None:
        """When a pending step must be posted even if no more output comes (monotonic)."""
        ...

    def flush_if_due(self, now: float) -> bool:
        """Post a pending step whose time has come; True when something was posted."""
        ...

    def flush(self) -> None:
        """Post what is pending (the child is dead)."""
        ...


@dataclass
class Run:
    """Everything about the current (or last) child."""

    run_no: int
    argv: tuple[str, ...]
    started_mono: float
    started_wall: float
    progress: Progress
    launched: Launched | None = None
    spawn_error: str | None = None  # exec failed: the run never lived
    reaped: bool = False  # its wait status was taken: the run is over
    create_time: float | None = None
    drains: list[PipeDrain] = field(default_factory=list)
    ended_by: EndedBy = EndedBy.CHILD
    alerted: set[AlertKind] = field(default_factory=set)
    gpu_baseline_mib: dict[int, float] = field(default_factory=dict)
    gpu_use: ChildGpuUse | None = None
    gpu_xids: list[int] = field(default_factory=list)
    pids_seen: set[int] = field(default_factory=set)
    cpu_seen_s: float | None = None  # the run cgroup's CPU time at the last look (sign of life)
    watcher: StepWatcher | None = None  # the drains' callback; flushed when the child dies
    elastic: ElasticState | None = None  # the job is a torchrun agent (a node of a larger job)
    dump_before_kill: str | None = None  # the dump dflashd waits for before its kill
    stacks: dict[str, Any] | None = None  # that dump: its file, the odd rank out, top frames
    pace_evidence: PaceEvidence = field(default_factory=PaceEvidence)  # why it runs slow
    slow: dict[str, Any] | None = None  # the open slow incident (status), None: none open
    diverged: dict[str, Any] | None = None  # its loss diverged: where, and why (status)
    end_wanted: EndedBy | None = None  # the observer asks the live run's control to end it
    flight_prefix: Path | None = None  # where its ranks' NCCL flight-recorder traces go
    hung_after_s: float | None = None  # a proven hang: last step -> the decision
    extensions_root: Path | None = None  # where torch JIT-builds extensions for this run
    gpu_seen: str = "unknown"  # the run's GPUs at the last sample: busy, idle or unknown
    gpu_power: PowerSeen = field(default_factory=PowerSeen)  # their power: stepping, now

    @property
    def pid(self) -> int | None:
        """The child's pid (also its process group), once launched."""
        return self.launched.pid if self.launched is not None else None

    @property
    def phase(self) -> Phase:
        """Where the child is in its life, from what is known of it (never set: derived)."""
        if self.reaped or self.spawn_error is not None:
            return Phase.EXITED
        if self.launched is None:
            return Phase.LAUNCHING
        return Phase.TRAINING if self.progress.reached_first_step else Phase.WARMING_UP

    @property
    def alive(self) -> bool:
        """Launched and not yet reaped."""
        return self.launched is not None and not self.reaped

    @property
    def ended_by_us(self) -> bool:
        """True once dflashd decided to end this run (stall, no GPU memory, stop)."""
        return self.ended_by is not EndedBy.CHILD

    @property
    def custody(self) -> RunCustody | None:
        """The run's processes, proven (its cgroup or pidfds): the only way to signal them."""
        return self.launched.custody if self.launched is not None else None

    def times(self) -> RunTimes:
        """Its moments as goodput counts them."""
        p = self.progress
        return RunTimes(
            launched=self.started_mono,
            first_step=p.first_step_mono,
            last_progress=p.last_progress_mono,
            best_before=p.best_before,
            passed_best=p.passed_best_mono,
            stepped=p.step is not None,
            recoveries=tuple(p.recoveries),
            slow_s=p.pace.lost_s,
        )

    def saw(self, pids: set[int]) -> None:
        """These pids were the run's (the child, its GPU process tree): remembered for the GPU
        join after they are gone (NVML may still list a dead pid)."""
        self.pids_seen |= pids

    def belongs(self, pid: int) -> bool:
        """Is ``pid`` part of this run, proven (cgroup membership, or pidfd proof)?

        The one test behind notify senders and GPU holders; a pid found to belong is
        remembered for the GPU join, but signals always go through the custody's proof.
        """
        custody = self.custody
        if custody is None:
            return False
        if pid == self.pid and self.alive:
            return True  # our unreaped child: its pid cannot have been reused
        if custody.owns(pid):
            self.pids_seen.add(pid)
            return True
        return False


def world_share(run: Run, watch: HangWatch, now: float) -> Share | None:
    """What this node shares with the others at a round's first sample (model/world.py):
    a node of a c10d rendezvous, its last round's finding (waiting, working, or nothing)."""
    elastic = run.elastic
    if elastic is None or not elastic.job.many_nodes or elastic.job.rdzv_backend != "c10d":
        return None
    finding: tuple[str, float, str] | None = None
    if watch.last_kind is Finding.ELSEWHERE and watch.elsewhere_since is not None:
        finding = (WAITING, now - watch.elsewhere_since, watch.last_finding or "")
    elif watch.last_kind in (Finding.WORKING, Finding.GPU_WAIT):
        finding = (WORKING, 0.0, watch.last_finding or "")
    job = elastic.job
    nodes = elastic.group_world_size if elastic.group_world_size is not None else job.max_nodes
    rank = node_rank(run, watch.last_dump)
    return share_of(job.rdzv_endpoint, job.rdzv_id, rank, nodes, finding)


def node_rank(run: Run, dump: StacksDump | None) -> int | None:
    """This node's group rank: torchrun's agent said it, or a worker's GROUP_RANK did (in
    ``dump``, the latest hang sample's stacks)."""
    if run.elastic is not None and run.elastic.group_rank is not None:
        return run.elastic.group_rank
    ranks = [p.role.group_rank for p in (dump.processes if dump is not None else ())]
    return next((r for r in ranks if r is not None), None)
