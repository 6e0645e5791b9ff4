"""Watching the live run: what the shell reads of it, handed to the model as inputs.

The :class:`RunObserver` reads: output lines (a step, a loss, torchrun's agent), sd_notify
datagrams (their sender proven the run's), GPU samples joined with the run's processes, what
the host says at a stall deadline and at a slowdown.  Each becomes one input of
:func:`~dflashd.supervisor.model.step.step`; what the evidence means (the run's progress, its
first step, a slowdown, a divergence, a recovery, the agent's rendezvous, no GPU memory) is
decided there (:mod:`~dflashd.supervisor.model.reading`).  It never changes the run's facts,
signals or records itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Final

from dflashd.supervisor.host.processops import ProcessOps
from dflashd.supervisor.host.procfs import CLK_TCK, read_stat
from dflashd.supervisor.model.effects import LookForSlowCauses
from dflashd.supervisor.model.inputs import (
    GpuSeen,
    Input,
    LinesSeen,
    NotifyRead,
    SlowCauses,
    StallLook,
)
from dflashd.supervisor.model.progress import NotifyMessage
from dflashd.supervisor.watch.gpuwatch import GpuWatch
from dflashd.supervisor.watch.nvml import GpuSample
from dflashd.supervisor.watch.pacewatch import PaceWatch
from dflashd.supervisor.watch.run import Run

TAIL_LINES: Final = 15  # the job's last lines a divergence's alert carries


class RunObserver:
    """Evidence of the live run in, inputs of the model out."""

    def __init__(
        self, gpu: GpuWatch, ops: ProcessOps, step: Callable[[Run | None, Input], object]
    ) -> None:
        self.gpu, self.ops = gpu, ops
        self.step = step  # the core's one way in (an input on its queue)
        self.pace = PaceWatch()  # the slowness evidence of the current run (its CPU waits)

    def lines(self, run: Run | None, seen: LinesSeen, now: float) -> bool:
        """Output from the run's pipes; True when handed to the model."""
        if run is None or run.run_no != seen.run_no or not run.alive:
            return False
        found = seen.progress
        if found is not None:
            self.pace.read_if_due(run.run_no, lambda: _members(run), now)
            if found.loss is not None or found.losses_from_nan:  # a divergence's alert says them
                # each drain's tail copied at once (in C, under the GIL): its thread appends
                # to it meanwhile, and a deque changed while Python iterates it raises
                tail = tuple(line for drain in run.drains for line in tuple(drain.tail))
                seen = replace(seen, tail=tail[-TAIL_LINES:])
        self.step(run, seen)
        return True

    def datagram(self, run: Run | None, msg: NotifyMessage, now: float) -> bool:
        """One sd_notify datagram; ignored unless its sender belongs to the live run."""
        if run is None or not run.alive:
            return False
        if msg.sender_pid is not None and not run.belongs(msg.sender_pid):
            return False  # a leftover of an earlier run, or a stranger: not this run's progress
        if msg.is_progress:
            self.pace.read_if_due(run.run_no, lambda: _members(run), now)
        worker = msg.sender_pid not in (None, run.pid)
        self.step(run, NotifyRead(run.run_no, msg, worker))
        return True

    def gpu_sample(self, run: Run | None, sample: GpuSample, now: float) -> None:
        """A GPU sample joined with the live run's processes (the model decides what it means,
        and whether a run holding no GPU memory ends)."""
        update = self.gpu.on_sample(sample, run, now)
        records, gpus = tuple(update.records), self.gpu.last
        if run is None or not run.alive:
            self.step(run, GpuSeen(None, records, gpus))
            return
        if update.busy_for_s is not None:
            self.pace.read_if_due(run.run_no, lambda: _members(run), now)
        seen = GpuSeen(
            run.run_no,
            records,
            gpus,
            use=update.judged,
            held=update.use,
            tree=update.tree,
            xids=update.xids,
            active=update.active,
            busy=update.busy_for_s is not None,
            power_w=update.power_w,
        )
        self.step(run, seen)

    def stall_look(self, run: Run) -> StallLook:
        """The run passed its progress deadline: what the host says of it, for the model's
        stall decider (a torchrun agent in its rendezvous whose workers run, too)."""
        progress = run.facts.progress
        if progress.rendezvous and run.pid is not None and self.ops.live_children(run.pid):
            return StallLook(run.run_no, False, None, workers_run=True)
        custody = run.custody  # whether the CPU counts as a sign of life is the model's rule
        if custody is None:
            return StallLook(run.run_no, False, None)
        stats = [found for pid in custody.members() if (found := read_stat(pid)) is not None]
        used = custody.cpu_time_s()
        if used is None:
            used = sum(found.cpu_ticks for found in stats) / CLK_TCK
        return StallLook(run.run_no, any(found.state == "R" for found in stats), used)

    # -- the executor's hands for a slowdown ------------------------------------------------

    def keep_pace_baseline(self, run: Run, now: float) -> None:
        """The run's own step time was just learnt: the host as it is now, kept."""
        self.pace.baseline_learnt(run.facts, self.gpu.readings, now)

    def slow_causes(self, run: Run, look: LookForSlowCauses) -> SlowCauses:
        """What the host says slowed the run down (watch/slowness.py)."""
        gpus, members = self.gpu.readings, _members(run)
        causes = self.pace.causes(
            run.facts, gpus, members, run.belongs, since=look.since, ratio=look.ratio
        )
        return SlowCauses(run.run_no, tuple(causes))


def _members(run: Run) -> set[int]:
    """The run's processes (its custody's; the root alone where it has none)."""
    members = run.custody.members() if run.custody is not None else set()
    return members or ({run.pid} if run.pid is not None else set())
