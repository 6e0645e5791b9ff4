"""A GPU that spins: a kernel that never returns (pure; issue 41).

A job whose kernel never returns waits in a synchronize or ``.item()`` with its GPU 100 %
busy, which is exactly how a GPU-bound evaluation looks to one sample.  The difference is
movement: an evaluation's loop goes on (its loop variables change from sample to sample, read
with py-spy's ``--locals``), a spinning kernel's caller stands still.  A round whose every
process waits on a busy GPU with frames *and* locals unmoved is a GPU wait with a key
(hang.py: ``Finding.GPU_WAIT``); the same key across rounds spanning :data:`GPU_SPIN_S` is
``gpu_spin``, a hang.  With no locals read (an old py-spy, frames without variables) nothing is
ever called a spin.  Module-level code has no locals that move, so the GPU's own evidence must
agree too: the run's GPUs draw at most half the power they drew while it stepped
(:class:`PowerSeen`); a kernel spinning on a flag keeps the GPU "busy" at near-idle power, an
evaluation draws what training drew.  With no power reading, nothing is called a spin.
"""

from __future__ import annotations

import statistics
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Final

GPU_SPIN_S: Final = 60.0  # the same unmoved GPU wait this long is a kernel that never returns
# ... and its GPUs draw at most this share of the power they drew while the run stepped: a
# kernel that spins on a flag keeps the GPU "busy" at near-idle power; an evaluation, busy
# at the same frame (module-level code has no locals that move), draws what training drew
SPIN_POWER_SHARE: Final = 0.5
STEPPING_POWER_SAMPLES: Final = 60


@dataclass(frozen=True, slots=True)
class PowerSeen:
    """The power a run's GPUs drew while it stepped, and now (held by the run; a value)."""

    stepping: tuple[float, ...] = ()  # the last STEPPING_POWER_SAMPLES readings while stepping
    now_w: float | None = None

    def take(self, watts: float | None, stepping: bool) -> PowerSeen:
        """One GPU sample's power; ``stepping``: the run made a step within the last moments."""
        if watts is not None and stepping:
            kept = (*self.stepping, watts)[-STEPPING_POWER_SAMPLES:]
            return PowerSeen(kept, watts)
        return PowerSeen(self.stepping, watts)

    def share(self) -> float | None:
        """Power now / the median while stepping (None: not known)."""
        if self.now_w is None or len(self.stepping) < 3:
            return None
        typical = statistics.median(self.stepping)
        return self.now_w / typical if typical > 0 else None


def spinning_power(share: float | None) -> bool:
    """The GPUs draw little next to their stepping power: no real work runs on them."""
    return share is not None and share <= SPIN_POWER_SHARE


@dataclass(frozen=True, slots=True)
class GpuWait:
    """A round whose every process waits on its busy GPU: unmoved (``key`` set) or not."""

    why: str
    key: int | None = None  # None: its loop moves, or no locals could be read (working)


def gpu_wait(
    first: dict[int, tuple[int, ...]], last: dict[int, tuple[int, ...]], stacks: Hashable
) -> GpuWait:
    """Every judged process waits on its busy GPU, frames unmoved over the round: ``first``
    and ``last`` are each process's threads' locals digests (by pid) at the round's first and
    last sample, ``stacks`` its frames; keyed when the locals stood still too."""
    pid = next(iter(last))
    if not any(any(digests) for digests in last.values()):
        return GpuWait(f"pid {pid} waits for its GPU, which is busy")
    for p, after in last.items():
        if first.get(p) != after:
            return GpuWait(f"pid {p} waits for its busy GPU, and its loop moves")
    key = hash((stacks, tuple(sorted(last.items()))))
    return GpuWait(f"pid {pid} waits for its busy GPU, frames and locals unmoved", key)


def spun_s(key: int | None, seen: tuple[int, float] | None, now: float) -> float | None:
    """How long the same GPU wait has stood (``seen``: its key, since when), once that is at
    least :data:`GPU_SPIN_S`; else None."""
    if key is None or seen is None or seen[0] != key or now - seen[1] < GPU_SPIN_S:
        return None
    return now - seen[1]
