"""The slowness evidence of the live run, read from the host: its CPU waits over time, its
GPUs when its own step time was learnt, and what slowed it down when the model says it turned
slow (issue 43).  The rules are pure (:mod:`~dflashd.supervisor.model.pace`; the slowdown's
record, alert and stacks: :mod:`~dflashd.supervisor.model.reading`); the causes are judged by
:mod:`slowness`.  Slowness is never a reason to end a run.
"""

from __future__ import annotations

from collections.abc import Callable

from dflashd.supervisor.model.runstate import RunState
from dflashd.supervisor.watch.nvml import GpuReading
from dflashd.supervisor.watch.slowness import PaceEvidence, slow_causes


def _held(facts: RunState) -> set[int]:
    use = facts.gpu_use
    return {i for i, mib in use.per_gpu_mib.items() if (mib or 0) > 0} if use else set()


class PaceWatch:
    """The slowness evidence of the current run (its CPU waits over time, its GPUs when the
    baseline was learnt): read from the host, kept here, a fresh one for each run."""

    def __init__(self) -> None:
        self._of: tuple[int, PaceEvidence] | None = None

    def evidence(self, run_no: int) -> PaceEvidence:
        """Run ``run_no``'s evidence (a new run starts with none)."""
        if self._of is None or self._of[0] != run_no:
            self._of = (run_no, PaceEvidence())
        return self._of[1]

    def read_if_due(self, run_no: int, members: Callable[[], set[int]], now: float) -> None:
        """The run steps: the CPU waits of its processes (``members``) read, at most every
        few seconds."""
        evidence = self.evidence(run_no)
        if evidence.cpu_due(now):
            evidence.read_cpu(members(), now)

    def baseline_learnt(self, facts: RunState, gpus: tuple[GpuReading, ...], now: float) -> None:
        """The run's own step time was just learnt: its CPU waits and its GPUs as they are."""
        self.evidence(facts.run_no).baseline_learnt(gpus, _held(facts), now)

    def causes(
        self,
        facts: RunState,
        gpus: tuple[GpuReading, ...],
        members: set[int],
        belongs: Callable[[int], bool],
        *,
        since: float,
        ratio: float | None,
    ) -> list[str]:
        """What slowed the run down since ``since`` (watch/slowness.py)."""
        return slow_causes(
            self.evidence(facts.run_no),
            pids=members,
            belongs=lambda pid: belongs(pid) or pid in facts.pids_seen,
            gpus=gpus,
            held=_held(facts),
            since=since,
            ratio=ratio,
        )
