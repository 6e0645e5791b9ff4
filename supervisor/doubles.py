"""What a test puts in place of the host, and the one error that refuses a start."""

from __future__ import annotations

from dataclasses import dataclass

from dflashd.supervisor.host.clock import Clock
from dflashd.supervisor.host.processops import ProcessOps
from dflashd.supervisor.watch.gpuwatch import SamplerFactory
from dflashd.supervisor.watch.linewatch import LineTap
from dflashd.supervisor.watch.stackdumps import Dumper


class StartupError(Exception):
    """Something the daemon needs before launching is unusable; nothing was launched."""


@dataclass(frozen=True, slots=True)
class HostDoubles:
    """What a test puts in place of the host (None: the real one): the clock, the processes,
    the GPU sampler, a tap on the run's frames, the stack dumps."""

    clock: Clock | None = None
    ops: ProcessOps | None = None
    sampler_factory: SamplerFactory | None = None
    line_tap: LineTap | None = None
    dumps: Dumper | None = None
