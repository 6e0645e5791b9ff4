"""GPU watch: the daemon's view of the GPUs, joined with the current run.

It turns each :class:`GpuSample` (from the poller thread) into what the daemon acts on:
records to write, what the run holds on which GPU (the model judges whether it holds none
past its grace), whether its GPUs have been busy long enough to count as training, and,
before a relaunch, whether the dead run's memory has been released.  Every method takes
``now``; it signals nothing itself (what :meth:`GpuWatch.release_check` finds is effects: its
records, the dead run's holders to kill, the next look; the core carries them out, the kill
through the run's custody).

GPU activity as evidence of training: a GPU counts as *busy* for the run when the run's
processes hold at least ``BUSY_MIN_MIB`` on it and NVML's utilisation (the share of the
last sample period in which a kernel ran) is at least ``gpu_busy_pct``.  Busy on every poll
for ``gpu_busy_s`` in a row is the run's first step (source ``gpu``).  A data loader runs no
kernels, and torch.compile's autotuning runs short bursts between long CPU phases, so
neither holds 60 % for 30 s; a training loop does.  Any busy poll is liveness.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Final

from dflashd.supervisor.host.config import Config
from dflashd.supervisor.host.processops import ProcessOps
from dflashd.supervisor.model.effects import WriteRecord
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.gpurelease import GpuHolders
from dflashd.supervisor.model.gpuuse import ChildGpuUse
from dflashd.supervisor.model.preflight import GpuHealth
from dflashd.supervisor.watch.nvml import (
    GpuPoller,
    GpuReading,
    GpuSample,
    GpuSampler,
    GpuUnavailable,
    gpu_pids_of_run,
    join_with_tree,
    reading_to_dict,
)
from dflashd.supervisor.watch.run import Run

RECORD_EVERY_S: Final = 60.0
RECORD_CHANGE_MIB: Final = 1024.0
BUSY_MIN_MIB: Final = 256.0

SamplerFactory = Callable[[Callable[[], int | None]], GpuSampler]


@dataclass(frozen=True, slots=True)
class GpuSettings:
    """The config keys the watch uses."""

    poll_s: float
    release_timeout_s: float
    busy_pct: float
    busy_s: float

    @classmethod
    def from_config(cls, config: Config) -> GpuSettings:
        """The GPU keys of the config."""
        return cls(
            config.gpu_poll_s,
            config.gpu_release_timeout_s,
            config.gpu_busy_pct,
            config.gpu_busy_s,
        )


@dataclass
class GpuUpdate:
    """What one sample means for the run."""

    records: list[WriteRecord] = field(default_factory=list)
    busy_for_s: float | None = None  # set once the run's GPUs were busy for gpu_busy_s in a row
    active: bool = False  # a kernel ran on the run's GPUs: liveness
    power_w: float | None = None  # the power the run's GPUs draw together (None: unknown)
    tree: frozenset[int] = frozenset()  # the run's pids on the GPUs (remembered for the join)
    use: ChildGpuUse | None = None  # the run's GPU use, where its pids are on the GPUs
    xids: tuple[int, ...] = ()  # XID errors on the GPUs the run holds memory on
    judged: ChildGpuUse | None = None  # this sample's join for a live run (the no-GPU verdict)


@dataclass
class ReleaseCheck:
    """What the GPUs say after a death: who holds memory (None: the checks are off), and where
    none of the dead run's processes does, the pre-flight's reads of the GPUs it held and their
    ECC at its launch."""

    holders: GpuHolders | None
    health: tuple[GpuHealth, ...] = ()
    ecc_at_launch: dict[int, int] = field(default_factory=dict)


class GpuWatch:
    """The ``_gpu_*`` state of the daemon, in one place."""

    def __init__(self, settings: GpuSettings) -> None:
        self.settings = settings
        self.status = "off"
        self._sampling = False
        self.last: tuple[dict[str, Any], ...] = ()
        self.poller: GpuPoller | None = None
        self._sample: GpuSample | None = None
        self._last_record_mono = float("-inf")
        self._last_record_total = 0.0
        self._samples = 0  # samples taken so far
        self._release_from: tuple[int, float] | None = None  # samples then, and when, at a death
        self._busy_since: float | None = None
        self._ecc_at_launch: dict[int, int] = {}  # each GPU's uncorrectable ECC at the launch

    @property
    def on(self) -> bool:
        """True when the GPU checks are on (a sampler was created)."""
        return self._sampling

    def begin(
        self,
        enabled: bool,
        factory: SamplerFactory,
        child_pid: Callable[[], int | None],
        deliver: Callable[[GpuSample], None],
    ) -> str | None:
        """Start the checks when the config wants them; why not, when they are off."""
        if not enabled:
            return self.off('gpus = "none" in the config')
        return self.start(factory, child_pid, deliver)

    def start(
        self,
        factory: SamplerFactory,
        child_pid: Callable[[], int | None],
        deliver: Callable[[GpuSample], None],
    ) -> str | None:
        """Create the sampler and take the pre-launch baseline; why not, when the checks are off."""
        try:
            sampler = factory(child_pid)
        except GpuUnavailable as exc:
            self.status = f"off ({exc})"
            return str(exc)
        self.status, self._sampling = f"on ({sampler.name})", True
        try:
            self.last = tuple(reading_to_dict(r, None) for r in sampler.sample())
        except Exception as exc:  # a broken driver must not stop the daemon
            self.status = f"on ({sampler.name}; baseline failed: {exc})"
        self.poller = GpuPoller(sampler, self.settings.poll_s, deliver)
        return None

    def off(self, reason: str) -> str:
        """GPU checks switched off by the config: ``reason``, for the model's record."""
        self.status = f"off ({reason})"
        return reason

    def stop(self) -> None:
        """Stop the poller thread."""
        if self.poller is not None:
            self.poller.stop()

    def baseline(self) -> dict[int, float]:
        """Used memory per GPU now: the baseline for a launch (container fallback)."""
        return {int(g["index"]): float(g.get("memory_used_mib") or 0.0) for g in self.last}

    def new_run(self) -> None:
        """A launch: forget the previous run's busy streak and its death's first look."""
        self._busy_since = None
        self._release_from = None
        counts = {h.index: h.uncorrectable_ecc for h in self._health(None)}
        self._ecc_at_launch = {i: n for i, n in counts.items() if n is not None}

    def _health(self, indices: tuple[int, ...] | None) -> tuple[GpuHealth, ...]:
        """The GPUs' health (model/preflight.py), where the sampler can read it."""
        reader = getattr(self.poller.sampler, "health", None) if self.poller else None
        if reader is None:
            return ()
        try:
            return tuple(reader(indices))
        except Exception:  # a broken driver must not stop the daemon
            return ()

    def preflight_reads(self, run: Run) -> ReleaseCheck:
        """Ready to relaunch: the GPUs the dead run held read for the pre-flight (every GPU
        watched when it was never seen to hold one: a run that died in CUDA's init did not)."""
        use = run.facts.gpu_use
        held = tuple(sorted(use.per_gpu_mib)) if use is not None and use.per_gpu_mib else None
        return ReleaseCheck(None, health=self._health(held), ecc_at_launch=self._ecc_at_launch)

    # -- samples ----------------------------------------------------------------------

    @property
    def readings(self) -> tuple[GpuReading, ...]:
        """The last sample's readings (none before the first)."""
        return self._sample.readings if self._sample is not None else ()

    def on_sample(self, sample: GpuSample, run: Run | None, now: float) -> GpuUpdate:
        """Join a sample with the run; say what it means."""
        self._sample = sample
        self._samples += 1
        update = GpuUpdate()
        tree: set[int] = set()
        alive = run is not None and run.alive and run.launched is not None
        facts = run.facts if alive and run is not None else None
        if facts is not None and run is not None and run.launched is not None:
            tree = gpu_pids_of_run(sample.readings, run.launched.pid, set(facts.pids_seen))
            update.tree = frozenset(tree)
        baseline = dict(facts.gpu_baseline_mib) if facts is not None else {}
        use = join_with_tree(sample.readings, tree, baseline)
        self.last = tuple(
            reading_to_dict(r, use.per_gpu_mib.get(r.index) if tree else None)
            for r in sample.readings
        )
        xids = [x for r in sample.readings for x in r.xids]
        if run is not None and tree:
            update.use = use
            if xids:
                update.xids = tuple(xids)
                update.records.append(
                    WriteRecord(Event.GPU_XID, {"xids": xids, "gpus": list(self.last)})
                )
        total = sum(float(e.get("memory_used_mib") or 0.0) for e in self.last)
        if (
            now - self._last_record_mono >= RECORD_EVERY_S
            or abs(total - self._last_record_total) >= RECORD_CHANGE_MIB
        ):
            self._last_record_mono = now
            self._last_record_total = total
            update.records.append(
                WriteRecord(
                    Event.GPU,
                    {
                        "gpus": list(self.last),
                        "method": use.method,
                        "poll_ms": round(sample.cost_s * 1000, 3),
                    },
                )
            )
        if alive and run is not None:
            update.judged = use
            self._busy_streak(use, now, update)
            held = [r.power_w for r in sample.readings if use.per_gpu_mib.get(r.index)]
            if held and all(w is not None for w in held):
                update.power_w = sum(w for w in held if w is not None)
        return update

    def _busy_streak(self, use: ChildGpuUse, now: float, update: GpuUpdate) -> None:
        busy = self._busy(use)
        update.active = busy
        if busy:
            self._busy_since = now if self._busy_since is None else self._busy_since
            if now - self._busy_since >= self.settings.busy_s:
                update.busy_for_s = now - self._busy_since
        else:
            self._busy_since = None

    def _busy(self, use: ChildGpuUse) -> bool:
        for entry in self.last:
            held = use.per_gpu_mib.get(int(entry["index"]))
            util = entry.get("utilization_pct")
            if held is None or util is None:
                continue
            if held >= BUSY_MIN_MIB and float(util) >= self.settings.busy_pct:
                return True
        return False

    # -- before a relaunch --------------------------------------------------------------

    def release_check(self, run: Run | None, ops: ProcessOps, now: float) -> ReleaseCheck:
        """Who holds GPU memory after the dead run, in a sample taken since its death (the
        model decides what that means: model/gpurelease.py); the pre-flight's reads where
        none of its processes holds any.  None: nothing to look at (the checks are off)."""
        sample = self._sample
        if not self.on or run is None or sample is None or run.launched is None:
            return ReleaseCheck(None)
        if self._release_from is None:  # the first look since the death
            self._release_from = (self._samples, now)
            self._sample_soon()
        samples_then, since = self._release_from
        if self._samples == samples_then and now - since < self.settings.poll_s:
            return ReleaseCheck(GpuHolders(False))
        seen = run.facts.pids_seen
        ours: list[dict[str, Any]] = []
        foreign: list[dict[str, Any]] = []
        for reading in sample.readings:
            for proc in reading.processes:
                if proc.used_mib is not None and proc.used_mib <= 0:
                    continue
                entry = {
                    "gpu": reading.index,
                    "pid": proc.pid,
                    "mib": proc.used_mib,
                    "cmd": ops.cmdline(proc.pid),
                }
                # Seen as the run's before (NVML may list a dead pid): named and waited for;
                # only a pid the custody proves now is ever signalled.
                mine = proc.pid in seen or run.belongs(proc.pid)
                (ours if mine else foreign).append(entry)
        holders = GpuHolders(True, tuple(ours), tuple(foreign))
        if not ours:
            self._release_from = None
            return replace(self.preflight_reads(run), holders=holders)
        self._sample_soon()  # the next look comes with a fresh sample
        return ReleaseCheck(holders)

    def _sample_soon(self) -> None:
        if self.poller is not None:
            self.poller.sample_soon()
