"""Where this daemon's job runs in a larger one (issue 55): the job, this node's rank in it and
the scheduler that placed it, read once from the environment the daemon was started with and
from the torchrun command, for metrics labels, records and status (pure: a mapping in).

- Slurm (``srun dflashd start --foreground -- torchrun …``): ``SLURM_JOB_ID`` is the job
  (``SLURM_STEP_ID`` the step), ``SLURM_NODEID`` this node's rank in it;
- torchrun alone: ``--rdzv-id`` is the job, ``--node-rank`` (a static rendezvous) the rank;
- neither: no job, no rank (a single-node job is its home).

Every series dflashd serves is labelled ``job``, ``node``, ``rank`` and ``home``, so one PromQL
query shows a job across its nodes whatever launched it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dflashd.supervisor.watch.elastic import torchrun_job


@dataclass(frozen=True, slots=True)
class Placement:
    """The job, this node's rank, the scheduler's step, and which scheduler said so."""

    job: str = ""
    rank: str = ""
    step: str = ""
    scheduler: str = ""  # "slurm", "torchrun" or ""

    def fields(self) -> dict[str, Any] | None:
        """For status and the ``spawn`` record (None: nothing placed it)."""
        if not (self.job or self.rank or self.scheduler):
            return None
        out = {"job": self.job, "rank": self.rank, "scheduler": self.scheduler}
        if self.step:
            out["step"] = self.step
        return out


def placement(env: Mapping[str, str], command: Sequence[str]) -> Placement:
    """Slurm's ids when the daemon runs in a Slurm job, else torchrun's, else none."""
    job_id = env.get("SLURM_JOB_ID", "").strip()
    if job_id:
        return Placement(
            job=job_id,
            rank=env.get("SLURM_NODEID", "").strip(),
            step=env.get("SLURM_STEP_ID", "").strip(),
            scheduler="slurm",
        )
    agent = torchrun_job(command)
    if agent is not None and (agent.rdzv_id or agent.node_rank):
        return Placement(job=agent.rdzv_id or "", rank=agent.node_rank or "", scheduler="torchrun")
    return Placement()
