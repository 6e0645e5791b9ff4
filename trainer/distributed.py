"""Many nodes: one trainer process per node under ``torchrun``, its threads on the node's GPUs.

Inside a node nothing changes: the worker threads' gradients are averaged into replica 0 on
the main thread.  Across nodes, replica 0's averaged gradient is all-reduced with
torch.distributed (gloo on CPU, NCCL on GPU) as one flat buffer, so every node takes the
same optimizer step and the replicas never drift apart.  Rank 0 writes the checkpoint; at
start rank 0 reads it and broadcasts it, so every node resumes from the same step even if a
save lands while the nodes start (torch elastic restarts all nodes' workers together).

torchrun's environment (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR``/``MASTER_PORT``) is the whole interface; a plain ``python -m
dflashd.trainer`` has none of it and runs alone, as before.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

# NVLink multicast (NVLS) off for every NCCL communicator we create: shared hosts forbid it.
NVLINK_MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
# A peer that died mid-step must fail the survivors' collective in bounded time, so that
# torchrun's agent sees the failure and restarts the group (gloo usually fails at once, on
# the closed connection; this is the bound when it cannot tell).  The same bound ends a
# process-group setup that hangs after a restart (seen on CPU with gloo: the nodes' workers
# of one round never meet), so torchrun rendezvouses again instead of waiting forever.
# --dist-timeout-s sets it; a step (checkpoint save included) must fit well inside it.
DEFAULT_DIST_TIMEOUT_S = 120.0
EX_PEER_STOPPED = 75  # EX_TEMPFAIL: stopped because another node was asked to (see stop_outcome)


@dataclass(frozen=True)
class Node:
    """This process's place in the job."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    backend: str

    @property
    def leader(self) -> bool:
        """Rank 0: writes checkpoints."""
        return self.rank == 0


def torchrun_world() -> tuple[int, int, int, int] | None:
    """(rank, world size, local rank, local world size) from torchrun's environment, else None."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    except ValueError:
        return None
    if world <= 1:
        return None
    return rank, world, local_rank, local_world


def join(device: str, timeout_s: float = DEFAULT_DIST_TIMEOUT_S) -> Node | None:
    """Join the process group torchrun set up; None when running alone."""
    world = torchrun_world()
    if world is None:
        return None
    rank, world_size, local_rank, local_world = world
    import torch.distributed as dist

    backend = "nccl" if device == "cuda" else "gloo"
    if backend == "nccl":
        for name, value in NVLINK_MULTICAST_OFF.items():
            os.environ.setdefault(name, value)
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
    return Node(rank, world_size, local_rank, local_world, backend)


def local_device_slots(count: int) -> list[int]:
    """The GPU indices this process may use: all of them, or its share under nproc-per-node > 1."""
    world = torchrun_world()
    if world is None or world[3] <= 1:
        return list(range(count))
    local_rank, local_world = world[2], world[3]
    mine = list(range(local_rank, count, local_world))
    return mine or [local_rank % max(1, count)]


def all_reduce_mean(params: list[torch.nn.Parameter], node: Node, stop_asked: bool) -> torch.Tensor:
    """Average ``params``' gradients over every node (one flat buffer, one collective).

    The same collective carries the stop requests: each node sets its own slot of a
    ``world_size`` vector; returned reduced, not read (reading would wait for the collective).
    """
    import torch.distributed as dist
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    with torch.no_grad():
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        asked = torch.zeros(node.world_size, dtype=grads[0].dtype, device=grads[0].device)
        asked[node.rank] = float(stop_asked)
        flat = _flatten_dense_tensors([*grads, asked])
        dist.all_reduce(flat)
        flat.div_(node.world_size)
        *reduced, asked = _unflatten_dense_tensors(flat, [*grads, asked])
        torch._foreach_copy_(grads, reduced)
        for p, g in zip(params, grads, strict=True):
            if p.grad is None:
                p.grad = g
        return asked


class StopVotes:
    """Which nodes were asked to stop (SIGTERM/SIGINT): the same answer on every node.

    The requests travel with the gradients' all-reduce, so all nodes stop after the same
    step, which rank 0 checkpoints, instead of the stopped node leaving the others waiting
    in the next step's collective until their grace runs out (no checkpoint).  Each step
    reads the previous step's requests, before queuing its own all-reduce: the worker
    threads have synchronised their devices by then, so the read costs no wait.  Alone,
    the answer is this process's own request, at once.
    """

    def __init__(self, node: Node | None) -> None:
        self.node = node
        self._pending: torch.Tensor | None = None

    def cast(self, params: list[torch.nn.Parameter], asked: bool) -> list[int]:
        """All-reduce ``params``' gradients with this node's request; the node ranks asking."""
        if self.node is None:
            return [0] if asked else []
        previous = self._pending
        askers = [] if previous is None else torch.nonzero(previous > 0).flatten().tolist()
        self._pending = all_reduce_mean(params, self.node, asked)
        return [int(r) for r in askers]


def stop_outcome(askers: list[int], node: Node | None, asked_here: bool) -> tuple[int, str]:
    """The exit code and the words after "stopped at step N (checkpoint …)".

    A node that was asked exits 0.  A node that stopped only because others were asked
    exits 75 (EX_TEMPFAIL), a failure to torchrun: it restarts this node's workers and
    waits in the rendezvous for the stopped nodes to come back (past its join timeout,
    dflashd says ``rendezvous_timeout``).  0 would end this node's agent as "succeeded"
    and its dflashd would call the job completed.
    """
    if node is None or asked_here:
        return 0, ""
    ranks = ", ".join(str(r) for r in askers)
    return EX_PEER_STOPPED, (
        f": node rank {ranks} asked to stop; exit {EX_PEER_STOPPED} so torchrun waits for it"
    )


def mean_over_nodes(values: list[float], device: torch.device, node: Node | None) -> list[float]:
    """Numbers (loss, accuracy) averaged over the nodes, for the log; unchanged when alone."""
    if node is None:
        return values
    import torch.distributed as dist

    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return [float(v) / node.world_size for v in tensor.tolist()]


def share_resume(resume: dict[str, Any] | None, node: Node | None) -> dict[str, Any] | None:
    """Rank 0's checkpoint for every node (None when it has none)."""
    if node is None:
        return resume
    import torch.distributed as dist

    box: list[Any] = [resume if node.leader else None]
    dist.broadcast_object_list(box, src=0)
    shared: dict[str, Any] | None = box[0]
    return shared


def leave(node: Node | None) -> None:
    """Leave the process group (a clean exit; nothing to do when alone)."""
    if node is None:
        return
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
