"""Never relaunch onto a GPU that cannot work (issue 51): the pre-flight rule, pure.

Before a relaunch after a death, the GPUs the dead run held are read through NVML
(``watch/gpuhealth.py``): each one's :class:`GpuHealth`.  A GPU that needs a reset or a
reboot is never relaunched onto.  The evidence, each alone enough:

- it does not answer NVML at all;
- the driver's GPU recovery action (driver >= 570) asks for a reset, a node reboot, or a
  drain (absent on older drivers: said once, never held against the GPU);
- page retirement is pending (a retired page takes effect at the next reset), or the row
  remapper failed (the GPU cannot spare a bad row);
- its uncorrectable (double-bit) ECC count rose since the dead run was launched;
- an XID of :data:`UNUSABLE_XIDS` in the dead run's evidence, on that GPU (or on a GPU NVML
  could not place).

A GPU that only logged correctable events is relaunched onto as before.  With the config's
``gpus`` naming more than one GPU and ``gpu_fallback = true``, the job is relaunched on the
others (``CUDA_VISIBLE_DEVICES``), said in a record and one alert; otherwise the daemon stops
with one alert naming the GPU, its UUID, the evidence and what an operator does, and exits
:data:`~dflashd.supervisor.model.exitcodes.EXIT_GPU_UNUSABLE` (75, EX_TEMPFAIL): Slurm's
``--requeue`` and a Kubernetes restart policy can act on it (the effects:
:mod:`~dflashd.supervisor.model.relaunch`).  A leaf: the standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

# NVIDIA's XID catalogue: the errors after which the GPU itself must be reset (or the node
# rebooted) before it can be trusted again.
UNUSABLE_XIDS: Final = {
    48: "double-bit ECC error (DBE): uncorrectable memory error",
    63: "ECC page retirement or row remapping event: the GPU needs a reset to apply it",
    64: "ECC page retirement or row remapper failure: the GPU needs a reset, and service",
    74: "NVLink error: the link is down until the GPU is reset",
    79: "the GPU has fallen off the bus: it needs a reboot (often a power or PCIe fault)",
    92: "high single-bit ECC error rate: the memory is failing",
    94: "contained ECC error: the GPU needs a reset before new work",
    95: "uncontained ECC error: every process on the GPU is affected; it needs a reset",
}

# nvmlDeviceGetFieldValues(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION): what the driver asks for.
RECOVERY_NONE: Final = 0
RECOVERY_ACTIONS: Final = {
    1: "a GPU reset",
    2: "a node reboot",
    3: "a drain of peer-to-peer traffic",
    4: "a drain, then a reset",
}

OPERATOR_RESET: Final = (
    "drain the node of jobs on this GPU, then reset it (nvidia-smi -r -i INDEX) or reboot the "
    "node; if it comes back, check `nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER`"
)
OPERATOR_REBOOT: Final = "reboot the node; if the GPU does not come back, it needs service"


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """One GPU as NVML reads it before a relaunch (None: the field is not there to read)."""

    index: int
    uuid: str | None = None
    answers: bool = True  # NVML reached it at all
    recovery_action: int | None = None  # None: the driver has no such field (< 570)
    retired_pending: bool | None = None
    remap_failed: bool | None = None
    uncorrectable_ecc: int | None = None  # volatile uncorrected ECC errors now
    error: str | None = None  # why it does not answer


@dataclass(frozen=True, slots=True)
class UnusableGpu:
    """A GPU that must not be relaunched onto: which, why, and what an operator does."""

    index: int
    uuid: str | None
    evidence: tuple[str, ...]
    operator: str

    def said(self) -> dict[str, object]:
        """The record's and the alert's fields."""
        return {
            "gpu": self.index,
            "uuid": self.uuid,
            "evidence": list(self.evidence),
            "operator": self.operator,
        }


@dataclass(frozen=True, slots=True)
class Preflight:
    """What the check says: ``unusable`` GPUs (none: relaunch as before); ``visible``: the
    GPUs to relaunch on instead (None: do not relaunch); ``notes``: said once, blame nobody
    (a driver without the recovery field)."""

    unusable: tuple[UnusableGpu, ...] = ()
    visible: tuple[int, ...] | None = None
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """Relaunch as before."""
        return not self.unusable

    @property
    def stop(self) -> bool:
        """No GPU left to relaunch on: the daemon stops for an operator."""
        return bool(self.unusable) and self.visible is None


def gpu_evidence(health: GpuHealth, ecc_at_launch: int | None, xids: Sequence[int]) -> list[str]:
    """Why this GPU cannot take work now (empty: it can)."""
    out: list[str] = []
    if not health.answers:
        out.append(f"it does not answer NVML ({health.error or 'no reason given'})")
        return out
    action = health.recovery_action
    if action is not None and action != RECOVERY_NONE:
        wanted = RECOVERY_ACTIONS.get(action, f"recovery action {action}")
        out.append(f"the driver asks for {wanted} (GPU recovery action {action})")
    if health.retired_pending:
        out.append("memory page retirement is pending (it applies at the next reset)")
    if health.remap_failed:
        out.append("the row remapper failed (no spare row for a failing one)")
    count = health.uncorrectable_ecc
    if count is not None and ecc_at_launch is not None and count > ecc_at_launch:
        out.append(f"uncorrectable ECC errors rose from {ecc_at_launch} to {count} during the run")
    for xid in sorted(set(xids)):
        if xid in UNUSABLE_XIDS:
            out.append(f"XID {xid}: {UNUSABLE_XIDS[xid]}")
    return out


def preflight(
    health: Sequence[GpuHealth],
    ecc_at_launch: dict[int, int],
    xids: dict[int, tuple[int, ...]],
    *,
    allowed: tuple[int, ...] | None,
    fallback: bool,
) -> Preflight:
    """The check over the GPUs the dead run held (``health``).

    ``ecc_at_launch``: each GPU's uncorrectable ECC count when the dead run launched;
    ``xids``: the dead run's XIDs by GPU (-1: a GPU NVML could not place: every GPU is
    suspect of it); ``allowed``: the GPUs the config gives the job (None: all of them);
    ``fallback``: relaunch on the rest when some are unusable.
    """
    unplaced = xids.get(-1, ())
    unusable: list[UnusableGpu] = []
    notes: list[str] = []
    if any(h.answers and h.recovery_action is None for h in health):
        notes.append("this driver reports no GPU recovery action (it needs driver 570 or newer)")
    for gpu in health:
        seen = (*xids.get(gpu.index, ()), *unplaced)
        evidence = gpu_evidence(gpu, ecc_at_launch.get(gpu.index), seen)
        if evidence:
            reboot = not gpu.answers or gpu.recovery_action == 2 or 79 in seen
            operator = OPERATOR_REBOOT if reboot else OPERATOR_RESET
            operator = operator.replace("INDEX", str(gpu.index))
            unusable.append(UnusableGpu(gpu.index, gpu.uuid, tuple(evidence), operator))
    if not unusable:
        return Preflight(notes=tuple(notes))
    bad = {u.index for u in unusable}
    pool = allowed if allowed is not None else tuple(sorted(h.index for h in health))
    rest = tuple(i for i in pool if i not in bad)
    visible = rest if fallback and rest and len(pool) > 1 else None
    return Preflight(tuple(unusable), visible, tuple(notes))
