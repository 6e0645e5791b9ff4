"""One run: a launch of the job, from ``spawn`` to ``exit`` (in the spirit of Supervisor's process.py).

A :class:`Run` holds the shell's handles on one child: its number (``run_no``), its launch
(pid, pipes, custody), its drains and the torchrun agent's watcher.  What the daemon knows of
it is ``run.facts`` (:class:`~dflashd.supervisor.model.runstate.RunState`), a value the
model keeps and replaces.  ``alive`` and ``belongs(pid)`` are the two questions the rest of
the daemon asks of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from dflashd.logs.drain import PipeDrain
from dflashd.supervisor.host.proof import Launched, RunCustody
from dflashd.supervisor.model.hang import Finding, HangWatch
from dflashd.supervisor.model.lifecycle import Phase
from dflashd.supervisor.model.runstate import RunState
from dflashd.supervisor.model.stacks import Role, StacksDump
from dflashd.supervisor.model.world import WAITING, WORKING, Share, share_of
from dflashd.supervisor.watch.elastic import ElasticState


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


# Where a run's facts are kept: run number -> its facts, as the model has them now (the core's
# :meth:`~dflashd.supervisor.core.DaemonCore.facts_of`).
FactsBook = Callable[[int], RunState]


@dataclass(eq=False)
class Run:
    """The shell's side of the current (or last) child: its handles.  What is known of it
    (its progress, evidence, who ended it) is ``facts``, a value the model keeps."""

    run_no: int
    book: FactsBook
    launched: Launched | None = None
    drains: tuple[PipeDrain, ...] = ()
    watcher: StepWatcher | None = None  # the drains' callback; flushed when the child dies
    elastic: ElasticState | None = None  # the job is a torchrun agent (a node of a larger job)
    reaped: bool = False  # its wait status was taken: the run is over (the one change)

    @property
    def facts(self) -> RunState:
        """What the model knows of this run now."""
        return self.book(self.run_no)

    @property
    def pid(self) -> int | None:
        """The child's pid (also its process group), once launched."""
        return self.launched.pid if self.launched is not None else None

    @property
    def phase(self) -> Phase:
        """Where the child is in its life, from what is known of it (never set: derived)."""
        facts = self.facts
        if self.reaped or facts.spawn_error is not None:
            return Phase.EXITED
        if self.launched is None:
            return Phase.LAUNCHING
        return Phase.TRAINING if facts.progress.reached_first_step else Phase.WARMING_UP

    @property
    def alive(self) -> bool:
        """Launched and not yet reaped."""
        return self.launched is not None and not self.reaped

    @property
    def custody(self) -> RunCustody | None:
        """The run's processes, proven (its cgroup or pidfds): the only way to signal them."""
        return self.launched.custody if self.launched is not None else None

    def belongs(self, pid: int) -> bool:
        """Is ``pid`` part of this run, proven (cgroup membership, or pidfd proof)?

        The one test behind notify senders and GPU holders; signals always go through the
        custody's proof.
        """
        custody = self.custody
        if custody is None:
            return False
        if pid == self.pid and self.alive:
            return True  # our unreaped child: its pid cannot have been reused
        return custody.owns(pid)


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
    roles = [p.role for p in (watch.last_dump.processes if watch.last_dump is not None else ())]
    # the workers' own round first (the agent's line may be an earlier round's)
    nodes = nodes_present(roles) or elastic.group_world_size or job.max_nodes
    rank = node_rank(run, watch.last_dump)
    world = next((r.world for r in roles if r.world is not None), None)
    return share_of(job.rdzv_endpoint, job.rdzv_id, rank, nodes, finding, world)


def nodes_present(roles: list[Role]) -> int | None:
    """The nodes of the round the workers run in (``--nnodes 1:4`` with two present: 2), from
    their ``WORLD_SIZE`` over ``LOCAL_WORLD_SIZE`` (None where that does not divide)."""
    for role in roles:
        world, local = role.world_size, role.local_world_size
        if world and local and world % local == 0:
            return world // local
    return None


def node_rank(run: Run, dump: StacksDump | None) -> int | None:
    """This node's group rank: torchrun's agent said it, or a worker's GROUP_RANK did (in
    ``dump``, the latest hang sample's stacks)."""
    if run.elastic is not None and run.elastic.group_rank is not None:
        return run.elastic.group_rank
    ranks = [p.role.group_rank for p in (dump.processes if dump is not None else ())]
    return next((r for r in ranks if r is not None), None)
