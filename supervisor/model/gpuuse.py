"""The run's GPU memory as the model judges it: how much its process tree holds, per GPU
(:func:`~dflashd.supervisor.watch.nvml.join_with_tree` measures it), and the no-GPU-memory
rule: a run alive past its grace with no first step that holds no GPU memory at all is
ended (``no_gpu_memory``).  Unknown is never zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ChildGpuUse:
    """How much GPU memory the child's process tree holds, per GPU, and how we know."""

    per_gpu_mib: dict[int, float | None] = field(default_factory=dict)
    method: str = "process"  # "process": NVML pids matched the tree; "device": baseline fallback

    @property
    def total_mib(self) -> float | None:
        """Sum over GPUs; None when any GPU's figure is unknown and none is known to be positive."""
        known = [v for v in self.per_gpu_mib.values() if v is not None]
        if any(v is None for v in self.per_gpu_mib.values()) and not any(v > 0 for v in known):
            return None
        return sum(known)


def holds_no_gpu_memory(
    use: ChildGpuUse, *, started_mono: float, grace_s: float, reached_first_step: bool, now: float
) -> bool:
    """The no-GPU-memory verdict: alive past ``grace_s`` with no first step, holding nothing
    on any GPU (a figure that is unknown is not zero; memory held means it does something)."""
    if reached_first_step or now - started_mono < grace_s:
        return False
    total = use.total_mib
    return total is not None and total <= 0
