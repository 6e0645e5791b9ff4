"""The GPUs' health through NVML, for the pre-flight before a relaunch (issue 51; the rule is
:mod:`~dflashd.supervisor.model.preflight`, pure).

Each field is read on its own: a field this driver or GPU does not have (the recovery action
before driver 570, ECC on a board without it) is None, never an error; a GPU NVML cannot
reach at all is ``answers=False``.  A healthy GPU's reads take well under a millisecond each.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, TypeVar

from dflashd.supervisor.model.preflight import GpuHealth

# nvml.h: NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (driver >= 570); nvidia-ml-py names it where new
RECOVERY_ACTION_FIELD: Final = 180
_T = TypeVar("_T")


def read_health(nvml: Any, index: int) -> GpuHealth:
    """One GPU's health now (``nvml``: the pynvml module, initialised)."""
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
    except nvml.NVMLError as exc:
        return GpuHealth(index, answers=False, error=str(exc))
    return GpuHealth(
        index,
        uuid,
        recovery_action=_field(nvml, lambda: _recovery_action(nvml, handle)),
        retired_pending=_field(nvml, lambda: _retired_pending(nvml, handle)),
        remap_failed=_field(nvml, lambda: bool(nvml.nvmlDeviceGetRemappedRows(handle)[3])),
        uncorrectable_ecc=_field(
            nvml,
            lambda: int(
                nvml.nvmlDeviceGetTotalEccErrors(
                    handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
                )
            ),
        ),
    )


def _field(nvml: Any, read: Callable[[], _T]) -> _T | None:
    """A field's value, None where this driver or GPU does not have it."""
    try:
        return read()
    except (nvml.NVMLError, AttributeError, TypeError, ValueError, IndexError):
        return None


def _recovery_action(nvml: Any, handle: Any) -> int | None:
    field_id = getattr(nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", RECOVERY_ACTION_FIELD)
    value = nvml.nvmlDeviceGetFieldValues(handle, [field_id])[0]
    if int(getattr(value, "nvmlReturn", 0)) != 0:
        return None  # not supported by this driver
    return int(value.value.uiVal)


def _retired_pending(nvml: Any, handle: Any) -> bool:
    status = nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)
    return int(status) == int(getattr(nvml, "NVML_FEATURE_ENABLED", 1))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
