"""The test kit: the real daemon loop driven by a manual clock, and the scripted doubles.

The approach of honcho's and Supervisor's tests: the daemon gets a :class:`ManualClock` and
a :class:`ScriptedProcesses` in place of the host's processes.  A scripted child has real
pipes (the real drains read them) but no process: the test decides when it writes, when it
dies and how.  Signals the daemon sends are recorded, not delivered.  Each test moves time
by hand, so a 15-minute stall or a 5-minute backoff takes milliseconds.
:class:`ScriptedSampler` replays GPU readings from a JSON file (tests/scripted_daemon.py
injects it into a real daemon process).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflashd.logs import EventRecord, read_records
from dflashd.supervisor.daemon import Daemon
from dflashd.supervisor.doubles import HostDoubles
from dflashd.supervisor.host.clock import ManualClock
from dflashd.supervisor.host.config import parse_config
from dflashd.supervisor.host.home import Home
from dflashd.supervisor.host.proof import SpawnedChild
from dflashd.supervisor.model.effects import WriteRecord
from dflashd.supervisor.model.inputs import LinesSeen
from dflashd.supervisor.model.preflight import GpuHealth
from dflashd.supervisor.model.progress import LineProgress
from dflashd.supervisor.model.stacks import StacksTaken, summary
from dflashd.supervisor.watch.nvml import GpuProcess, GpuReading


@dataclass
class ScriptedChild:
    pid: int
    out_w: int
    err_w: int
    status: int | None = None
    alive: bool = True


@dataclass
class ScriptedCustody:
    """A run's custody with no process behind it: signals are recorded, not delivered."""

    ops: ScriptedProcesses
    root_pid: int
    mode: str = "scripted"
    root_reaped: bool = False

    def _alive(self) -> bool:
        child = self.ops.children.get(self.root_pid)
        return child is not None and child.alive

    def members(self) -> set[int]:
        return {self.root_pid} if self._alive() else set()

    def owns(self, pid: int) -> bool:
        return pid == self.root_pid or pid in self.ops.holders

    def signal_root(self, signum: int) -> bool:
        self.ops.signals.append(("pid", self.root_pid, signum))
        return self._alive()

    def signal_group(self, signum: int) -> int:
        self.ops.signals.append(("group", self.root_pid, signum))
        return int(self._alive())

    def signal_all(self, signum: int) -> int:
        self.ops.signals.append(("all", self.root_pid, signum))
        return int(self._alive())

    def signal_pid(self, pid: int, signum: int) -> bool:
        self.ops.signals.append(("pid", pid, signum))
        return self.owns(pid)

    def kill_all(self) -> None:
        self.ops.signals.append(("all", self.root_pid, signal.SIGKILL))

    def empty(self) -> bool:
        return not self._alive()

    def wait_empty(self, timeout_s: float) -> bool:
        return self.empty()

    def cpu_time_s(self) -> float | None:
        return self.ops.cpu_s

    def oom_kills(self) -> int:
        return 0

    def reaped(self, cpu_s: float | None = None) -> None:
        self.root_reaped = True

    def close(self) -> None:
        return None


@dataclass
class ScriptedProcesses:
    """A stand-in for the host's processes (the ProcessOps seam)."""

    children: dict[int, ScriptedChild] = field(default_factory=dict)
    signals: list[tuple[str, int, int]] = field(default_factory=list)
    next_pid: int = 40000
    gone_without_status: set[int] = field(default_factory=set)
    kids: dict[int, set[int]] = field(default_factory=dict)  # pid -> its live children
    holders: set[int] = field(default_factory=set)  # pids the custody proves (GPU holders)
    cpu_s: float | None = None  # the run cgroup's CPU time (None: pidfd mode, unknown)
    fail_spawns: list[OSError] = field(default_factory=list)  # raised by the next spawns
    mode: str = "scripted"

    def spawn(
        self, argv: tuple[str, ...], *, cwd: Path, env: Mapping[str, str], run_no: int
    ) -> SpawnedChild:
        if self.fail_spawns:
            raise self.fail_spawns.pop(0)
        pid, self.next_pid = self.next_pid, self.next_pid + 1
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        self.children[pid] = ScriptedChild(pid, out_w, err_w)
        return SpawnedChild(pid, out_r, err_r, custody=ScriptedCustody(self, pid))

    def die(self, pid: int, *, code: int | None = None, sig: int | None = None) -> None:
        """The child ends: its pipes close, its wait status is ready."""
        child = self.children[pid]
        if not child.alive:
            return
        child.alive = False
        child.status = (code or 0) << 8 if sig is None else sig
        os.close(child.out_w)
        os.close(child.err_w)

    def wait_nohang(self, pid: int) -> int | None:
        if pid in self.gone_without_status:
            raise ChildProcessError(pid)
        child = self.children[pid]
        return None if child.alive else child.status

    def live_children(self, pid: int) -> set[int]:
        return set(self.kids.get(pid, set()))

    def reaped_cpu_s(self, pid: int) -> float | None:
        return self.cpu_s

    def create_time(self, pid: int) -> float | None:
        return 1.7e9 if pid in self.children else None

    def start_ticks(self, pid: int) -> int | None:
        return 170_000 if pid in self.children else None

    def cmdline(self, pid: int) -> str:
        return "scripted"

    def reap_orphans(self, keep: set[int]) -> None:
        return None

    def recover(
        self, previous: dict[str, Any], boot: str | None, timeout_s: float
    ) -> list[WriteRecord]:
        return []

    def close(self) -> None:
        return None

    def sent(self, signum: int) -> list[int]:
        return [pid for _, pid, sig in self.signals if sig == signum]


class ScriptedDumps:
    """Stack dumps with no py-spy: ``start`` is recorded, the test posts the result
    (``StacksTaken``) itself.  Unavailable by default: the faulthandler path, as on a host
    without py-spy."""

    def __init__(self, available: bool = False) -> None:
        self._available = available
        self.started: list[tuple[int, str, str]] = []  # (run, trigger, dump id)
        self.reporter: Any = None

    @property
    def available(self) -> bool:
        return self._available

    def tool(self) -> str:
        return "scripted" if self._available else "unavailable: scripted"

    def next_id(self, run: Any) -> str:
        return f"{run.run_no}-{len(self.started) + 1}"

    def start(
        self, run: Any, trigger: str, *, native: bool = False, dump_id: str | None = None
    ) -> str:
        dump_id = dump_id or self.next_id(run)
        self.started.append((run.run_no, trigger, dump_id))
        return dump_id

    def sample(self, run: Any, share: Any = None) -> None:
        self.started.append((run.run_no, "hang_sample", ""))

    def taken(self, message: StacksTaken, wall: float) -> tuple[dict[str, Any], str]:
        fields = {"dump_id": message.dump_id, "path": f"/scripted/{message.dump_id}.txt"}
        fields.update(summary(message.dump))
        return fields, "warning"


class Harness:
    """A daemon on a temp home, with the clock and the children in the test's hands."""

    def __init__(
        self, home: Path, config: dict[str, Any], sampler: Any = None, dumps: bool = False
    ) -> None:
        self.clock = ManualClock()
        self.ops = ScriptedProcesses()
        self.dumps = ScriptedDumps(available=dumps)
        config = {"gpus": "none", **config}
        factory = (lambda _pid: sampler) if sampler is not None else None
        Home(home).create()
        doubles = HostDoubles(
            clock=self.clock, ops=self.ops, sampler_factory=factory, dumps=self.dumps
        )
        self.daemon = Daemon(Home(home), parse_config(config), doubles=doubles)
        self.dumps.reporter = self.daemon.reporter
        self.alerts: list[tuple[str, str]] = []  # (kind, reason) handed to the sinks, in order
        real_alert = self.daemon.reporter.alert

        def alert(run_no: int, step: int | None, kind: Any, reason: str, *rest: Any) -> None:
            self.alerts.append((kind.value, reason))
            real_alert(run_no, step, kind, reason, *rest)

        self.daemon.reporter.alert = alert  # type: ignore[method-assign]
        self.daemon.open()
        if self.daemon.gpu.poller is not None:  # samples come from the test, not a thread
            self.daemon.gpu.poller.stop()
            self.daemon.gpu.poller = None

    @property
    def pid(self) -> int:
        run = self.daemon.run
        assert run is not None and run.pid is not None
        return run.pid

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.daemon.turn()

    def advance_to_next_timer(self) -> float:
        timeout = self.daemon.next_timeout()
        assert timeout is not None
        self.advance(timeout)
        return timeout

    def step(self, step: int, source: str = "plain") -> None:
        run = self.daemon.run
        assert run is not None
        self.daemon.inbox.post(
            LinesSeen(run.run_no, LineProgress(step, True, source), f"step {step}")
        )
        self.daemon.turn()

    def output(self, line: str = "working") -> None:
        run = self.daemon.run
        assert run is not None
        self.daemon.inbox.post(LinesSeen(run.run_no, None, line))
        self.daemon.turn()

    def die(self, *, code: int | None = None, sig: int | None = None) -> None:
        self.ops.die(self.pid, code=code, sig=sig)
        self.daemon.reap()
        self.daemon.turn()

    def events(self, name: str) -> list[EventRecord]:
        self.daemon.reporter.sink.flush()
        return [
            r
            for r in read_records(self.daemon.home.logs)
            if isinstance(r, EventRecord) and r.event == name
        ]

    def close(self) -> None:
        for child in self.ops.children.values():
            if child.alive:
                self.ops.die(child.pid, sig=signal.SIGKILL)
        self.daemon.close()


class ScriptedSampler:
    """Replays readings from a JSON file: for tests and demos on machines without a GPU.

    The file holds a list of steps; each step is a list of readings (dicts with the fields
    of :class:`GpuReading`, ``processes`` as ``[pid_or_"child", mib]`` pairs).  The last step
    repeats.  ``"child"`` stands for the current child's pid, given through ``child_pid``.
    """

    name = "scripted"

    def __init__(self, path: Path, child_pid: Callable[[], int | None]) -> None:
        self._path = path
        self._steps: list[list[dict[str, Any]]] = json.loads(path.read_text())
        self._index = 0
        self._child_pid = child_pid

    def sample(self) -> tuple[GpuReading, ...]:
        """The next scripted step."""
        step = self._steps[min(self._index, len(self._steps) - 1)]
        self._index += 1
        child = self._child_pid() or -1
        readings = []
        for raw in step:
            procs = tuple(
                GpuProcess(child if pid == "child" else int(pid), mib)
                for pid, mib in raw.get("processes", [])
            )
            readings.append(
                GpuReading(
                    index=int(raw["index"]),
                    memory_used_mib=raw.get("memory_used_mib"),
                    memory_total_mib=raw.get("memory_total_mib"),
                    utilization_pct=raw.get("utilization_pct"),
                    processes=procs,
                    error=raw.get("error"),
                    xids=tuple(raw.get("xids", ())),
                )
            )
        return tuple(readings)

    def health(self, indices: tuple[int, ...] | None = None) -> tuple[GpuHealth, ...]:
        """The pre-flight's reads: ``<script>.health.json`` (a list of GpuHealth fields),
        else every scripted GPU healthy."""
        beside = self._path.with_suffix(".health.json")
        raw = json.loads(beside.read_text()) if beside.exists() else []
        found = tuple(GpuHealth(**h) for h in raw)
        return tuple(h for h in found if indices is None or h.index in indices)

    def close(self) -> None:
        """Nothing to release."""
