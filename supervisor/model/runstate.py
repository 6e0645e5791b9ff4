"""One run's facts as a value: what the daemon knows of a launch of the job, from ``spawn`` to
``exit``.

A :class:`RunState` holds the run's number and launch, its progress, who ended it and why,
its GPU evidence and the incidents open on it.  It has no handles (pipes, drains, custody and
watchers stay with the shell's :class:`~dflashd.supervisor.watch.run.Run`), and nothing
changes it: :func:`~dflashd.supervisor.model.step.step` keeps the current run's facts in the
daemon's state and replaces them, from what the loop heard (a reading of new evidence, a GPU
sample, a stall look) and from the effects that concern the run (an alert sent, its end
decided, its dump kept).  :class:`RunFacts` is what is known when it has ended, for
:func:`~dflashd.supervisor.model.ending.conclude`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from dflashd.supervisor.model.agent import AgentView
from dflashd.supervisor.model.goodput import RunTimes
from dflashd.supervisor.model.gpuspin import PowerSeen
from dflashd.supervisor.model.gpuuse import ChildGpuUse
from dflashd.supervisor.model.progress import Progress
from dflashd.supervisor.model.verdicts import AlertKind, EndedBy, Observations

CPU_LIFE_SHARE: Final = 0.1  # a run that used at least this share of a CPU over its life was alive


@dataclass(frozen=True, slots=True)
class RunState:
    """Everything the daemon knows about the current (or last) run, as a value."""

    run_no: int
    argv: tuple[str, ...]
    started_mono: float
    started_wall: float
    progress: Progress
    spawn_error: str | None = None  # exec failed: the run never lived
    create_time: float | None = None  # its root's start time (status: the pid's proof)
    start_ticks: int | None = None  # the same in ticks since boot (a clock step moves no tick)
    ended_by: EndedBy = EndedBy.CHILD
    alerted: frozenset[AlertKind] = frozenset()
    gpu_baseline_mib: Mapping[int, float] = field(default_factory=dict)  # used, before launch
    gpu_use: ChildGpuUse | None = None
    gpu_xids: tuple[int, ...] = ()
    pids_seen: frozenset[int] = frozenset()  # its pids so far (NVML may list a dead pid)
    cpu_seen_s: float | None = None  # its CPU time at the last stall look (sign of life)
    dump_before_kill: str | None = None  # the dump dflashd waits for before its kill
    stacks: Mapping[str, Any] | None = None  # that dump: its file, the odd rank out, top frames
    slow: Mapping[str, Any] | None = None  # the open slow incident (status), None: none open
    diverged: Mapping[str, Any] | None = None  # its loss diverged: where, and why (status)
    hung_after_s: float | None = None  # a proven hang: last step -> the decision
    gpu_seen: str = "unknown"  # its GPUs at the last sample: busy, idle or unknown
    gpu_power: PowerSeen = field(default_factory=PowerSeen)  # their power: stepping, now
    flight_prefix: Path | None = None  # where its ranks' NCCL flight-recorder traces go
    extensions_root: Path | None = None  # where torch JIT-builds extensions for this run
    start: str = "cold"  # "warm": it ran in the standby interpreter (host/standby.py)
    agent: AgentView | None = None  # the job is a torchrun agent: its view (a node of a larger job)

    @property
    def ended_by_us(self) -> bool:
        """True once dflashd decided to end this run (stall, no GPU memory, stop, a hang)."""
        return self.ended_by is not EndedBy.CHILD

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

    def saw(self, pids: frozenset[int] | set[int]) -> RunState:
        """These pids were the run's (the child, its GPU process tree): remembered for the GPU
        join after they are gone."""
        if pids <= self.pids_seen:
            return self
        return replace(self, pids_seen=self.pids_seen | pids)

    def alerted_of(self, kind: AlertKind) -> RunState:
        """An alert of ``kind`` was sent for this run."""
        return replace(self, alerted=self.alerted | {kind})

    def lived_s(self, duration_s: float, cpu_s: float | None) -> float:
        """From the launch to the last sign of life (output, notify or GPU activity): what
        tells an early death from a crash (``classify``); the whole duration when the run kept
        :data:`CPU_LIFE_SHARE` of a CPU busy over it (a silent CPU-bound job)."""
        progress = self.progress
        last = max(
            progress.last_alive_mono or self.started_mono,
            progress.last_progress_mono or self.started_mono,
        )
        lived = max(0.0, last - self.started_mono)
        if cpu_s is not None and duration_s > 0 and cpu_s >= CPU_LIFE_SHARE * duration_s:
            lived = duration_s
        return lived

    def ending(self, why: EndedBy, *, hung_after_s: float | None = None) -> RunState:
        """dflashd decided to end the run, for ``why``."""
        hung = self.hung_after_s if hung_after_s is None else hung_after_s
        return replace(self, ended_by=why, hung_after_s=hung)


def stall_decide(
    facts: RunState, *, runnable: bool, cpu_used_s: float | None, now: float
) -> tuple[RunState, EndedBy | None]:
    """The run passed its progress deadline: why it ends, or (None) that it turns out not to be
    stuck, with its facts as they are now.

    Before its first step, with no way to see steps, a silent run that computes is alive:
    computing is judged by what the run does, never by how much CPU the machine gives it: one
    of its processes is runnable (``runnable``), or the CPU time of all of them
    (``cpu_used_s``) grew at all since the last look.  A job blocked in a wait uses none and
    is not alive by this rule.
    """
    progress = facts.progress
    watching_cpu = not (
        progress.reached_first_step or progress.sees_steps or progress.rendezvous
    ) and (cpu_used_s is not None or runnable)
    if watching_cpu:
        before = facts.cpu_seen_s if facts.cpu_seen_s is not None else 0.0
        used = cpu_used_s if cpu_used_s is not None else before
        facts = replace(facts, cpu_seen_s=used)
        if runnable or used > before:  # silent but computing: looked at again a period later
            return replace(facts, progress=progress.on_alive(now)), None
    return facts, progress.stall_reason()


@dataclass(frozen=True, slots=True)
class RunFacts:
    """What is known about a run when it has ended."""

    run_no: int
    obs: Observations
    duration_s: float | None
    ended_at: float = 0.0  # wall clock
    first_step_after_s: float | None = None
    progress_s: float = 0.0
    step: int | None = None
    epoch: float | None = None
    tail: tuple[str, ...] = ()
    already_alerted: frozenset[AlertKind] = frozenset()
    stop_requested: bool = False
    stacks: dict[str, Any] | None = None  # the dump taken before dflashd ended the run
    flight_recorder: tuple[str, ...] = ()  # NCCL flight-recorder traces the ranks left
    hung_after_s: float | None = None  # a proven hang: from the last step to the decision
    stale_build_locks: tuple[str, ...] = ()  # JIT-build locks older than the run (early deaths)
    times: RunTimes | None = None  # its launch, first step, progress (goodput); None: lost
    died_mono: float | None = None
    stop_at: float | None = None  # monotonic: when the user asked to stop
    # the hang rounds found it waiting on work elsewhere when it died: (the wait, for how long)
    waited_elsewhere: tuple[str, float] | None = None
    hang_evidence: str | None = None  # why a proven hang was proven (the world's wait named)
    pause_s: float | None = None  # its pauses between steps (a checkpoint's cost; advice.py)
