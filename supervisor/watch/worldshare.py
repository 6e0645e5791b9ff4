"""What this node shares with the job's other nodes at a hang round (model/world.py decides
what their answers mean): its finding, its place in the world, the round it belongs to."""

from __future__ import annotations

from dflashd.supervisor.model.hang import HangWatch
from dflashd.supervisor.model.judge import Finding
from dflashd.supervisor.model.stacks import Role, StacksDump
from dflashd.supervisor.model.world import WAITING, WORKING, Share, share_of
from dflashd.supervisor.watch.run import Run


def world_share(run: Run, watch: HangWatch, now: float) -> Share | None:
    """What this node shares with the others at a round's first sample (model/world.py):
    a node of a c10d rendezvous, its last round's finding (waiting, working, or nothing)."""
    elastic = run.facts.agent
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
    agent = run.facts.agent
    if agent is not None and agent.group_rank is not None:
        return agent.group_rank
    ranks = [p.role.group_rank for p in (dump.processes if dump is not None else ())]
    return next((r for r in ranks if r is not None), None)
