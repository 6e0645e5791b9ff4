"""A node of a larger job, as values: torchrun's options, its agent's lines, and the run's view
of its agent (failures and restarts torchrun handled itself, the rendezvous).

Reading the agent (its command line, its log lines) is :mod:`~dflashd.supervisor.watch.elastic`;
what a line means for the run is decided here and in :mod:`~dflashd.supervisor.model.reading`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any


@dataclass(frozen=True, slots=True)
class TorchrunJob:
    """The torchrun options that say what the node waits for (None: not given)."""

    nnodes: str = "1"
    nproc_per_node: str | None = None
    rdzv_backend: str | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    max_restarts: int | None = None
    node_rank: str | None = None  # --node-rank (static rendezvous)

    @property
    def max_nodes(self) -> int | None:
        """The most nodes that may take part (``--nnodes=2``: 2, ``1:4``: 4; None: unreadable)."""
        top = self.nnodes.split(":")[-1]
        return int(top) if top.isdigit() else None

    @property
    def many_nodes(self) -> bool:
        """More than one node may take part (``--nnodes=2`` or ``1:4``)."""
        return self.nnodes.split(":")[-1] not in ("", "1")

    def fields(self) -> dict[str, Any]:
        """For records and status."""
        return {
            "nnodes": self.nnodes,
            "rdzv_endpoint": self.rdzv_endpoint,
            "rdzv_id": self.rdzv_id,
            "max_restarts": self.max_restarts,
        }


class AgentSaid(StrEnum):
    """What an agent line means."""

    WORKER_FAILED = "worker_failed"  # ERROR: a local worker exited non-zero (always logged)
    GROUP_RESTART = "group_restart"  # INFO: "Worker group FAILED. 3/3 attempts left; will restart"
    MEMBERSHIP_RESTART = "membership_restart"  # INFO: a node joined; the group restarts to admit it
    RENDEZVOUS_WAIT = "rendezvous_wait"  # INFO: "Rendezvous'ing worker group"
    RENDEZVOUS_DONE = "rendezvous_done"  # INFO: "Rendezvous complete" / "has joined round"
    RENDEZVOUS_TIMEOUT = "rendezvous_timeout"  # the agent gave up waiting for its peers
    WORLD = "world"  # INFO: a line of the "Rendezvous complete" block (group_rank=…)


# agent lines that say torchrun restarts the run's workers itself (goodput: downtime, redone)
RESTARTING = (AgentSaid.WORKER_FAILED, AgentSaid.GROUP_RESTART, AgentSaid.MEMBERSHIP_RESTART)


@dataclass(frozen=True, slots=True)
class AgentLine:
    """One agent line, understood."""

    said: AgentSaid
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AgentView:
    """One run's view of its agent: failures and restarts torchrun handled, the rendezvous."""

    job: TorchrunJob
    worker_failures: int = 0
    group_restarts: int = 0  # torchrun restarted its workers (a failure, or a node joining)
    rendezvous: str = "waiting"  # "waiting" until the workers run, then "complete"
    rendezvous_since: float | None = None  # monotonic
    group_rank: int | None = None
    group_world_size: int | None = None

    def took(self, line: AgentLine, now: float) -> tuple[AgentView, bool]:
        """The view after one agent line; True when the line is worth a record."""
        said = line.said
        if said is AgentSaid.WORKER_FAILED:
            return replace(self, worker_failures=self.worker_failures + 1), True
        if said in (AgentSaid.GROUP_RESTART, AgentSaid.MEMBERSHIP_RESTART):
            return replace(self, group_restarts=self.group_restarts + 1), True
        if said is AgentSaid.RENDEZVOUS_WAIT:
            if self.rendezvous == "waiting":
                return self, False  # the first wait is the launch's own; nothing new
            return replace(self, rendezvous="waiting", rendezvous_since=now), True
        if said is AgentSaid.RENDEZVOUS_DONE:
            world = self._world(line.fields)
            if self.rendezvous == "complete" and not line.fields:
                return world, False
            return world.running(), True
        if said is AgentSaid.WORLD:
            return self._world(line.fields), False
        return self, True

    def running(self) -> AgentView:
        """Evidence that the workers run (a worker's notify, a step): the rendezvous is over."""
        return replace(self, rendezvous="complete", rendezvous_since=None)

    def _world(self, fields: dict[str, Any]) -> AgentView:
        rank = fields.get("group_rank", self.group_rank)
        size = fields.get("group_world_size", self.group_world_size)
        return replace(self, group_rank=rank, group_world_size=size)

    def said(self, fields: dict[str, Any]) -> dict[str, Any]:
        """The fields of a ``rendezvous`` record of the view now, after ``fields``."""
        said = {"state": self.rendezvous, **fields}
        if self.rendezvous == "complete":
            said.setdefault("group_rank", self.group_rank)
            said.setdefault("group_world_size", self.group_world_size)
        return said

    def view(self) -> dict[str, Any]:
        """The ``elastic`` object of ``status --json``."""
        return {
            **self.job.fields(),
            "rendezvous": self.rendezvous,
            "worker_failures": self.worker_failures,
            "restarts": self.group_restarts,
            "group_rank": self.group_rank,
            "group_world_size": self.group_world_size,
        }
