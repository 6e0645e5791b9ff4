"""GPU sampling: an interface, the real NVML implementation, and the pure join with the child's tree.

The daemon never calls NVML on its main loop or a pipe-draining thread: a
:class:`GpuPoller` thread samples every ``gpu_poll_s`` and hands readings over.  NVML
(``import pynvml``, from nvidia-ml-py) is imported lazily, so a machine without a GPU
or with a broken driver only loses the GPU checks, and says so once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from dflashd.supervisor.model.gpuuse import ChildGpuUse
from dflashd.supervisor.model.preflight import GpuHealth

_MIB: Final = 1024 * 1024


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """One compute process on a GPU; ``used_mib`` None means NVML did not say (not zero)."""

    pid: int
    used_mib: float | None


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU at one instant."""

    index: int
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    utilization_pct: float | None = None
    processes: tuple[GpuProcess, ...] = ()
    error: str | None = None
    xids: tuple[int, ...] = ()
    power_w: float | None = None  # the board's power draw (a spinning kernel draws little)
    sm_clock_mhz: float | None = None  # the SM clock now (a throttled GPU runs below its own)
    temperature_c: float | None = None


@dataclass(frozen=True, slots=True)
class GpuSample:
    """All GPUs at one instant (monotonic time of the poll)."""

    at_s: float
    readings: tuple[GpuReading, ...]
    cost_s: float = 0.0


class GpuSampler(Protocol):
    """What the daemon needs from a GPU backend."""

    name: str

    def sample(self) -> tuple[GpuReading, ...]:
        """Read every selected GPU; never raises for one GPU's error (it goes in ``error``)."""
        ...

    def close(self) -> None:
        """Release the backend."""
        ...


class GpuUnavailable(Exception):
    """No GPU backend here: the GPU checks are off (the message says why)."""


class NvmlSampler:
    """The real sampler on nvidia-ml-py."""

    name = "nvml"

    def __init__(self, gpus: str | tuple[int, ...]) -> None:
        try:
            import pynvml
        except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
            raise GpuUnavailable(f"nvidia-ml-py is not importable: {exc}") from None
        self._nvml: Any = pynvml
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            raise GpuUnavailable(f"NVML unavailable: {exc}") from None
        indices = list(range(count)) if gpus == "all" else [i for i in gpus if isinstance(i, int)]
        missing = [i for i in indices if i >= count]
        if missing:
            raise GpuUnavailable(f"gpus {missing} do not exist (this machine has {count})")
        if not indices:
            raise GpuUnavailable("NVML sees no GPU")
        self._handles = {i: pynvml.nvmlDeviceGetHandleByIndex(i) for i in indices}
        self._events: Any = None
        try:
            self._events = pynvml.nvmlEventSetCreate()
            for handle in self._handles.values():
                pynvml.nvmlDeviceRegisterEvents(
                    handle, pynvml.nvmlEventTypeXidCriticalError, self._events
                )
        except pynvml.NVMLError:
            self._events = None  # XID events are not supported everywhere (e.g. some VMs)

    def health(self, indices: tuple[int, ...] | None = None) -> tuple[GpuHealth, ...]:
        """The pre-flight's reads of these GPUs (None: every selected one): watch/gpuhealth.py."""
        from dflashd.supervisor.watch.gpuhealth import read_health  # only at a relaunch

        chosen = tuple(self._handles) if indices is None else indices
        return tuple(read_health(self._nvml, i) for i in chosen)

    def _memory(self, handle: Any) -> tuple[float, float]:
        nvml = self._nvml
        try:
            # v2 excludes the driver's reserved memory, so an idle GPU reads near 0 (v1 reads ~600 MiB).
            info = nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
        except (nvml.NVMLError, TypeError, AttributeError):
            info = nvml.nvmlDeviceGetMemoryInfo(handle)
        return info.used / _MIB, info.total / _MIB

    def _xids(self) -> dict[int, list[int]]:
        nvml = self._nvml
        out: dict[int, list[int]] = {}
        if self._events is None:
            return out
        by_handle = {id(h): i for i, h in self._handles.items()}
        while True:
            try:
                data = nvml.nvmlEventSetWait_v2(self._events, 0)
            except nvml.NVMLError:
                return out
            index = by_handle.get(id(data.device), -1)
            out.setdefault(index, []).append(int(data.eventData))

    def sample(self) -> tuple[GpuReading, ...]:
        """Memory (v2), utilisation and compute processes of each GPU."""
        nvml = self._nvml
        xids = self._xids()
        readings = []
        for index, handle in self._handles.items():
            try:
                used, total = self._memory(handle)
                util = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                procs = tuple(
                    GpuProcess(
                        int(p.pid),
                        None if p.usedGpuMemory is None else p.usedGpuMemory / _MIB,
                    )
                    for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)
                )
                try:
                    power: float | None = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
                except nvml.NVMLError:
                    power = None  # not supported on this board
                found = tuple(xids.get(index, ()))
                clock, temp = self._clock_and_temperature(handle)
                readings.append(
                    GpuReading(
                        index,
                        used,
                        total,
                        util,
                        procs,
                        xids=found,
                        power_w=power,
                        sm_clock_mhz=clock,
                        temperature_c=temp,
                    )
                )
            except nvml.NVMLError as exc:
                readings.append(GpuReading(index, error=str(exc), xids=tuple(xids.get(index, ()))))
        return tuple(readings)

    def _clock_and_temperature(self, handle: Any) -> tuple[float | None, float | None]:
        """The SM clock (MHz) and the temperature (C); None for what the board does not say."""
        nvml = self._nvml
        try:
            clock: float | None = float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))
        except nvml.NVMLError:
            clock = None
        try:
            temp: float | None = float(
                nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
            )
        except nvml.NVMLError:
            temp = None
        return clock, temp

    def close(self) -> None:
        """Shut NVML down."""
        try:
            if self._events is not None:
                self._nvml.nvmlEventSetFree(self._events)
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass


# -- the pure join ---------------------------------------------------------------------


def join_with_tree(
    readings: Iterable[GpuReading],
    tree_pids: set[int],
    baseline_used_mib: dict[int, float],
    *,
    rise_threshold_mib: float = 256.0,
) -> ChildGpuUse:
    """Attribute GPU memory to the child's process tree.

    NVML reports host pids.  When none of them is in the tree but a device's used memory
    rose by more than ``rise_threshold_mib`` over the baseline taken before launch, the pids
    do not match (a container's pid namespace): fall back to the device-level rise.
    """
    readings = [r for r in readings if r.error is None]
    per_gpu: dict[int, float | None] = {}
    matched_any = False
    for r in readings:
        mine = [p for p in r.processes if p.pid in tree_pids]
        if mine:
            matched_any = True
            if any(p.used_mib is None for p in mine):
                per_gpu[r.index] = None
            else:
                per_gpu[r.index] = sum(p.used_mib or 0.0 for p in mine)
        else:
            per_gpu[r.index] = 0.0
    if matched_any:
        return ChildGpuUse(per_gpu, "process")
    rises = {
        r.index: (r.memory_used_mib or 0.0) - baseline_used_mib.get(r.index, 0.0)
        for r in readings
        if r.memory_used_mib is not None
    }
    if tree_pids and any(rise > rise_threshold_mib for rise in rises.values()):
        # Memory rose since launch but no listed pid is ours: the pids live in another
        # namespace (a container).  Judge by the device's rise over the pre-launch baseline.
        return ChildGpuUse({i: max(0.0, rise) for i, rise in rises.items()}, "device")
    return ChildGpuUse(per_gpu, "process")


def gpu_pids_of_run(readings: Iterable[GpuReading], root_pid: int, known: set[int]) -> set[int]:
    """Which of the pids on the GPUs belong to the run started as ``root_pid`` (its own process group).

    Costs a syscall or two per GPU process instead of a walk over every process on the host:
    a pid counts when it is already known, is in the run's process group, or descends from
    the root (checked by walking its parents, for processes that left the group).
    """
    import os

    import psutil

    mine = {root_pid}
    for reading in readings:
        for proc in reading.processes:
            pid = proc.pid
            if pid in known or pid in mine:
                mine.add(pid)
                continue
            try:
                if os.getpgid(pid) == root_pid:
                    mine.add(pid)
                    continue
            except OSError:
                continue
            try:
                if any(parent.pid == root_pid for parent in psutil.Process(pid).parents()):
                    mine.add(pid)
            except psutil.Error:
                continue
    return mine


def reading_to_dict(r: GpuReading, child_mib: float | None) -> dict[str, Any]:
    """The ``gpus`` entry of ``status --json`` and of ``gpu`` records."""
    out: dict[str, Any] = {
        "index": r.index,
        "memory_used_mib": None if r.memory_used_mib is None else round(r.memory_used_mib, 1),
        "memory_total_mib": None if r.memory_total_mib is None else round(r.memory_total_mib, 1),
        "utilization_pct": r.utilization_pct,
        "child_memory_mib": None if child_mib is None else round(child_mib, 1),
    }
    if r.power_w is not None:
        out["power_w"] = round(r.power_w, 1)
    if r.sm_clock_mhz is not None:
        out["sm_clock_mhz"] = round(r.sm_clock_mhz)
    if r.temperature_c is not None:
        out["temperature_c"] = round(r.temperature_c)
    if r.error:
        out["error"] = r.error
    return out


class GpuPoller:
    """A thread that samples every ``interval_s`` and hands each sample to ``deliver``."""

    def __init__(
        self, sampler: GpuSampler, interval_s: float, deliver: Callable[[GpuSample], None]
    ) -> None:
        self.sampler = sampler
        self._interval_s = interval_s
        self._deliver = deliver
        self._stop = threading.Event()
        self._wake = threading.Event()  # a sample wanted now (a dead run's memory, say)
        self._thread = threading.Thread(target=self._run, name="dflashd-gpu", daemon=True)

    def start(self) -> None:
        """Start polling."""
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                readings = self.sampler.sample()
            except Exception as exc:  # a backend bug must not kill the daemon
                readings = (GpuReading(-1, error=f"sampler failed: {exc}"),)
            self._deliver(GpuSample(time.monotonic(), readings, time.monotonic() - started))
            self._wake.wait(self._interval_s)
            self._wake.clear()

    def sample_soon(self) -> None:
        """Take the next sample now instead of at the end of the interval."""
        self._wake.set()

    def stop(self) -> None:
        """Stop and release the backend."""
        self._stop.set()
        self._wake.set()
        if self._thread.ident is not None:
            self._thread.join(5)
        self.sampler.close()
