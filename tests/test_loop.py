"""The daemon's real logic driven by a manual clock and scripted children (no process is touched).

The approach of honcho's and Supervisor's tests: the daemon gets a :class:`ManualClock` and a
:class:`ScriptedProcesses` in place of the host's processes.  A scripted child has real pipes
(the real drains read them) but no process: the test decides when it writes, when it dies
and how.  Signals the daemon sends are recorded, not delivered.  Each test moves time by
hand, so a 15-minute stall or a 5-minute backoff takes milliseconds.
"""

from __future__ import annotations

import errno
import os
import signal
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dflashd.logs import EventRecord, read_records
from dflashd.supervisor.clock import ManualClock
from dflashd.supervisor.config import parse_config
from dflashd.supervisor.daemon import Daemon
from dflashd.supervisor.elastic import AgentLine, AgentSaid
from dflashd.supervisor.gpu import GpuProcess, GpuReading, GpuSample
from dflashd.supervisor.home import Home
from dflashd.supervisor.inbox import GpuSampled
from dflashd.supervisor.launch import Launched
from dflashd.supervisor.lifecycle import State
from dflashd.supervisor.progress import LineProgress, LinesSeen


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
    ) -> Launched:
        if self.fail_spawns:
            raise self.fail_spawns.pop(0)
        pid, self.next_pid = self.next_pid, self.next_pid + 1
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        self.children[pid] = ScriptedChild(pid, out_w, err_w)
        return Launched(pid, out_r, err_r, custody=ScriptedCustody(self, pid))

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

    def cmdline(self, pid: int) -> str:
        return "scripted"

    def reap_orphans(self, keep: set[int]) -> None:
        return None

    def recover(
        self, previous: dict[str, Any], boot: str | None, timeout_s: float
    ) -> list[tuple[str, int, dict[str, Any]]]:
        return []

    def close(self) -> None:
        return None

    def sent(self, signum: int) -> list[int]:
        return [pid for _, pid, sig in self.signals if sig == signum]


class Harness:
    """A daemon on a temp home, with the clock and the children in the test's hands."""

    def __init__(self, home: Path, config: dict[str, Any], sampler: Any = None) -> None:
        self.clock = ManualClock()
        self.ops = ScriptedProcesses()
        config = {"gpus": "none", **config}
        factory = (lambda _pid: sampler) if sampler is not None else None
        Home(home).create()
        self.daemon = Daemon(
            Home(home),
            parse_config(config),
            clock=self.clock,
            ops=self.ops,
            sampler_factory=factory,
        )
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


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Any]:
    made: list[Harness] = []

    def make(config: dict[str, Any], sampler: Any = None) -> Harness:
        h = Harness(tmp_path / "home", config, sampler)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


def test_first_step_timeout_applies_when_steps_are_visible(harness: Any) -> None:
    """A pattern says what a step is: none by first_step_timeout_s -> SIGABRT, SIGKILL 3 s later, stalled."""
    h = harness({"first_step_pattern": "^step ", "first_step_timeout_s": 600.0})
    assert h.daemon.next_timeout() == pytest.approx(600.0)
    h.advance(599.0)
    assert h.ops.sent(signal.SIGABRT) == []
    h.advance(1.0)
    assert h.ops.sent(signal.SIGABRT) == [h.pid]
    assert h.events("ending_run")[0].fields["why"] == "first_step_timeout"
    assert h.advance_to_next_timer() == pytest.approx(3.0)  # the stack-dump grace
    assert h.pid in h.ops.sent(signal.SIGKILL)
    h.die(sig=signal.SIGKILL)
    exit_rec = h.events("exit")[0]
    assert (exit_rec.fields["verdict"], exit_rec.fields["reason"]) == (
        "stalled",
        "first_step_timeout",
    )


def test_no_visible_steps_means_only_silence_ends_the_run(harness: Any) -> None:
    """No pattern, no notify, no known format: output keeps the run alive for hours; silence ends it."""
    h = harness({"first_step_timeout_s": 60.0, "stall_timeout_s": 900.0})
    for _ in range(72):  # two hours of output every 100 s, no recognisable step
        h.advance(100.0)
        h.output("loading shard")
    assert h.ops.sent(signal.SIGABRT) == []
    assert h.daemon.state is State.RUNNING
    h.advance(899.0)
    assert h.ops.sent(signal.SIGABRT) == []
    h.advance(1.0)
    assert h.ops.sent(signal.SIGABRT) == [h.pid]
    assert h.events("ending_run")[0].fields["why"] == "no_progress"


def test_a_silent_run_using_cpu_is_alive_until_it_stops_computing(harness: Any) -> None:
    """cgroup mode: before any step, silence with CPU time growing is not a stall; idle silence is."""
    h = harness({"first_step_timeout_s": 60.0, "stall_timeout_s": 900.0})
    h.ops.cpu_s = 0.0
    for hour in range(1, 4):  # three periods of silence, each with 600 CPU-seconds used
        h.ops.cpu_s = 600.0 * hour
        h.advance(900.0)
        assert h.ops.sent(signal.SIGABRT) == [], hour
    h.advance(900.0)  # silent, and the CPU time did not move: stalled
    assert h.ops.sent(signal.SIGABRT) == [h.pid]
    assert h.events("ending_run")[0].fields["why"] == "no_progress"


def test_out_of_descriptors_defers_the_launch_without_a_verdict(harness: Any) -> None:
    """EMFILE at a relaunch: launch_deferred, the same run number tried again a second later,
    no exit record, no budget spent."""
    h = harness({"restart": {"backoff_initial_s": 0.0, "backoff_max_s": 1.0, "early_retries": 2}})
    h.output("warming")
    h.ops.fail_spawns.append(OSError(errno.EMFILE, "Too many open files"))
    h.die(code=1)
    h.advance(0.0)
    deferred = h.events("launch_deferred")
    assert [d.run for d in deferred] == [2] and "EMFILE" in deferred[0].fields["error"]
    assert len(h.events("exit")) == 1 and h.daemon.run is not None and h.daemon.run.run_no == 1
    h.advance(1.0)
    launched = h.events("launched")
    assert [r.run for r in launched] == [1, 2]
    assert h.daemon.state is State.RUNNING and len(h.events("exit")) == 1


def test_stall_after_first_step(harness: Any) -> None:
    """Steps stop: stalled (no_progress) exactly stall_timeout_s after the last one."""
    h = harness({"stall_timeout_s": 300.0})
    h.advance(20.0)
    h.step(1, "nanogpt")
    assert h.daemon.status()["phase"] == "training"
    assert h.daemon.status()["first_step_source"] == "nanogpt"
    h.advance(100.0)
    h.step(2, "nanogpt")
    h.advance(299.0)
    h.output("a line that is not a step")  # it reports steps: plain output is not progress
    assert h.ops.sent(signal.SIGABRT) == []
    h.advance(1.0)
    assert h.ops.sent(signal.SIGABRT) == [h.pid]


def test_backoff_doubles_with_jitter_under_the_ceiling(harness: Any) -> None:
    """Each consecutive early death waits backoff_initial_s * 2^(n-1) +-20 %, never above the ceiling."""
    h = harness({"restart": {"early_retries": 10, "backoff_initial_s": 1.0, "backoff_max_s": 8.0}})
    for n in range(1, 7):
        runs_before = len(h.events("spawn"))
        h.output("starting")
        h.die(code=1)
        delay = h.events("restart")[-1].fields["delay_s"]
        base = min(8.0, 2.0 ** (n - 1))
        assert min(8.0, 0.8 * base) <= delay <= min(8.0, 1.2 * base)
        assert h.daemon.next_timeout() == pytest.approx(delay, abs=1e-3)
        h.advance(delay * 0.99)
        assert len(h.events("spawn")) == runs_before  # not yet
        h.advance_to_next_timer()
        assert len(h.events("spawn")) == runs_before + 1


def test_runtime_budget_resets_after_stable_progress(harness: Any) -> None:
    """runtime_retries = 1: two crashes after 700 s of progress each restart; two after 10 s are fatal."""
    restart = {
        "runtime_retries": 1,
        "stable_after_s": 600.0,
        "backoff_initial_s": 0.0,
        "no_progress_restarts": 0,  # every run ends at step 2: that rule is tested on its own
    }
    h = harness({"restart": restart})
    for n in range(1, 4):
        h.step(1)
        h.advance(700.0)
        h.step(2)
        h.die(code=1)  # a zero backoff: the relaunch follows within the same turn
        assert h.events("exit")[-1].fields["verdict"] == "crashed"
        assert (
            len(h.events("restart")) == n and h.events("restart")[-1].fields["runtime_crashes"] == 1
        )
    h.step(1)
    h.advance(10.0)
    h.step(2)
    h.die(code=1)
    assert h.events("restart")[-1].fields["runtime_crashes"] == 1  # the budget's one retry
    h.step(1)
    h.advance(10.0)
    h.step(2)
    h.die(code=1)
    assert h.daemon.state is State.FATAL
    assert h.events("fatal")[0].fields["reason"] == "runtime_retries_exhausted"


def test_a_crash_loop_that_never_passes_its_step_is_fatal(harness: Any) -> None:
    """Resume at 900, die at 1000, again and again (each run stable long enough to reset the
    budgets): the third run that does not pass step 1000 is fatal, naming the step."""
    h = harness({"restart": {"backoff_initial_s": 0.0, "stable_after_s": 60.0}})
    for _ in range(3):
        h.step(900)
        h.advance(120.0)
        h.step(1000)
        h.die(code=1)
        assert h.daemon.state is not State.FATAL
    h.step(900)
    h.advance(120.0)
    h.step(1000)
    h.die(code=1)
    assert h.daemon.state is State.FATAL
    assert h.events("fatal")[0].fields["reason"] == "no_progress_past_step_1000"
    assert [e.fields["kind"] for e in h.events("alert") if e.fields.get("kind") == "fatal"] == []


def test_a_run_that_passes_the_best_step_resets_the_count(harness: Any) -> None:
    h = harness({"restart": {"backoff_initial_s": 0.0, "stable_after_s": 60.0}})
    for end in (1000, 1000, 1000, 1001, 1001, 1001):
        h.step(900)
        h.advance(120.0)
        h.step(end)
        h.die(code=1)
    assert h.daemon.state is not State.FATAL
    h.step(900)
    h.advance(120.0)
    h.step(1001)
    h.die(code=1)
    assert h.events("fatal")[0].fields["reason"] == "no_progress_past_step_1001"


def test_a_long_life_without_steps_is_a_runtime_crash(harness: Any) -> None:
    """No step seen (a bar that never reaches the pipe), output for six minutes, then a crash:
    crashed with no_step_seen, no cache clearing, the runtime budget; a crash after 10 s of
    life stays an early death."""
    h = harness({"restart": {"backoff_initial_s": 0.0, "early_death_s": 300.0}})
    for _ in range(36):
        h.advance(10.0)
        h.output("Epoch 0 ━━━━━━━━ 3/8")
    h.die(code=1)
    exit_rec = h.events("exit")[-1].fields
    assert exit_rec["verdict"] == "crashed" and exit_rec["reason"] == "exit_code_1:no_step_seen"
    restart = h.events("restart")[-1].fields
    assert restart["cache_cleared"] is False and restart["runtime_crashes"] == 1
    assert restart["early_deaths"] == 0
    h.advance(10.0)
    h.output("loading")
    h.die(code=1)  # (scripted output reaches no pipe: no output line is counted)
    assert h.events("exit")[-1].fields["verdict"] == "silent_death"


def test_a_job_that_logs_rarely_is_judged_by_its_own_cadence(harness: Any) -> None:
    """Steps printed every 1,000 s (DeepSpeed's steps_per_print at 10 s a step) against a
    900 s stall_timeout_s: never stalled while the cadence holds; stalled at 3x it."""
    h = harness({"stall_timeout_s": 900.0})
    for n in range(1, 6):
        h.step(100 * n)
        h.advance(899.0 if n == 1 else 1000.0)
    assert h.ops.sent(signal.SIGABRT) == []
    h.step(600)
    h.advance(2999.0)
    assert h.ops.sent(signal.SIGABRT) == []
    h.advance(1.0)
    assert h.ops.sent(signal.SIGABRT) == [h.pid]


def test_a_silent_cpu_bound_life_is_a_runtime_crash(harness: Any) -> None:
    """No output at all, but the CPU busy for ten minutes (its wait4 time): crashed."""
    h = harness({"restart": {"backoff_initial_s": 0.0}, "stall_timeout_s": 100000.0})
    h.ops.cpu_s = 590.0
    h.advance(600.0)
    h.die(sig=signal.SIGKILL)
    exit_rec = h.events("exit")[-1].fields
    assert exit_rec["verdict"] == "crashed" and exit_rec["reason"] == "SIGKILL:no_step_seen"


def _sample(pid: int, mib: float) -> GpuSample:
    procs = (GpuProcess(pid, mib),) if mib > 0 else ()
    return GpuSample(0.0, (GpuReading(0, 3000.0 if mib else 10.0, 81559.0, 0.0, procs),))


class FixedSampler:
    name = "fixed"

    def sample(self) -> tuple[GpuReading, ...]:
        return ()

    def close(self) -> None:
        return None


def test_relaunch_waits_for_the_dead_runs_gpu_memory(harness: Any) -> None:
    """The dead run still holds memory: its holder is SIGKILLed, the relaunch waits until it is freed."""
    h = harness(
        {
            "gpus": "all",
            "gpu_poll_s": 2.0,
            "gpu_release_timeout_s": 60.0,
            "restart": {"backoff_initial_s": 1.0, "backoff_max_s": 1.0, "early_retries": 5},
        },
        sampler=FixedSampler(),
    )
    dead = h.pid
    h.daemon.inbox.post(GpuSampled(_sample(dead, 2400.0)))
    h.output("warming")
    h.die(code=1)
    h.advance(1.0)  # the backoff is over, but the memory is still held
    assert len(h.events("spawn")) == 1
    assert h.ops.sent(signal.SIGKILL) == [dead]
    assert h.events("gpu_memory_held")[0].fields["holders"][0]["pid"] == dead
    assert h.daemon.next_timeout() == pytest.approx(2.0)  # look again after the next poll
    h.advance(2.0)
    assert len(h.events("spawn")) == 1  # the scripted sample still shows it
    h.daemon.inbox.post(GpuSampled(_sample(dead, 0.0)))
    h.advance(2.0)
    assert len(h.events("spawn")) == 2
    assert h.events("gpu_memory_released")[0].fields["waited_s"] == pytest.approx(4.0)


def test_gpu_activity_is_a_first_step_for_a_silent_trainer(harness: Any) -> None:
    """Busy GPUs holding the job's memory for gpu_busy_s in a row: phase training, source gpu."""
    h = harness({"gpus": "all", "gpu_busy_s": 30.0, "gpu_busy_pct": 60.0}, sampler=FixedSampler())
    busy = GpuSample(0.0, (GpuReading(0, 9000.0, 81559.0, 97.0, (GpuProcess(h.pid, 8000.0),)),))
    idle = GpuSample(0.0, (GpuReading(0, 9000.0, 81559.0, 3.0, (GpuProcess(h.pid, 8000.0),)),))
    for sample in (busy, busy, idle, busy):  # a compile burst, interrupted: not a first step
        h.daemon.inbox.post(GpuSampled(sample))
        h.advance(10.0)
    assert h.daemon.status()["phase"] == "warming_up"
    for _ in range(4):
        h.daemon.inbox.post(GpuSampled(busy))
        h.advance(10.0)
    status = h.daemon.status()
    assert (status["phase"], status["first_step_source"]) == ("training", "gpu")


def test_unknown_wait_status_is_never_a_success(harness: Any) -> None:
    """The child is gone but waitpid cannot say how: not completed, and restarted."""
    h = harness({"restart": {"backoff_initial_s": 0.0}})
    h.step(1)
    h.ops.gone_without_status.add(h.pid)
    h.ops.die(h.pid, code=0)
    h.daemon.reap()
    exit_rec = h.events("exit")[0]
    assert exit_rec.fields["verdict"] == "crashed"
    assert exit_rec.fields["reason"] == "exit_status_unknown"


def test_stop_timeout_is_bounded_and_sigkills(harness: Any) -> None:
    """stop with a huge or invalid timeout falls back to the config's; SIGKILL when it passes."""
    h = harness({"restart": {"stop_timeout_s": 5.0}})
    h.daemon.request_stop(float("inf"))
    assert h.ops.sent(signal.SIGTERM) == [h.pid]
    assert h.daemon.next_timeout() == pytest.approx(5.0)
    h.advance(5.0)
    assert h.pid in h.ops.sent(signal.SIGKILL)
    h.die(sig=signal.SIGKILL)
    assert h.daemon.state is State.STOPPED


TORCHRUN = [
    "torchrun",
    "--nnodes=2",
    "--nproc-per-node=1",
    "--rdzv-backend=c10d",
    "--rdzv-endpoint=10.0.0.1:29400",
    "--rdzv-id=job7",
    "train.py",
]


def test_a_node_waiting_for_its_peers_ends_as_rendezvous_timeout(harness: Any) -> None:
    """A torchrun agent with no workers is in its rendezvous: silence is warm-up; first_step_timeout_s ends it."""
    h = harness({"command": TORCHRUN, "first_step_timeout_s": 600.0, "stall_timeout_s": 300.0})
    h.advance(300.0)  # silent past stall_timeout_s: not a stall while waiting for peers
    assert h.ops.sent(signal.SIGABRT) == []
    assert h.daemon.status()["elastic"]["rendezvous"] == "waiting"  # type: ignore[index]
    assert h.daemon.status()["elastic"]["rendezvous_waiting_s"] == pytest.approx(300.0)  # type: ignore[index]
    h.advance(300.0)
    assert h.ops.sent(signal.SIGABRT) == [h.pid]
    assert h.events("ending_run")[0].fields["why"] == "rendezvous_timeout"
    h.advance_to_next_timer()
    h.die(sig=signal.SIGKILL)
    exit_rec = h.events("exit")[0]
    assert exit_rec.fields["verdict"] == "rendezvous_timeout"
    assert h.events("spawn")[0].fields["torchrun"]["rdzv_endpoint"] == "10.0.0.1:29400"


def test_an_agent_whose_workers_run_is_past_its_rendezvous(harness: Any) -> None:
    """At the deadline the process tree decides: workers running means the rendezvous is over."""
    h = harness({"command": TORCHRUN, "first_step_timeout_s": 600.0, "stall_timeout_s": 900.0})
    h.ops.kids[h.pid] = {h.pid + 100}
    h.advance(600.0)
    assert h.ops.sent(signal.SIGABRT) == []
    rendezvous = h.events("rendezvous")[-1].fields
    assert (rendezvous["state"], rendezvous["evidence"]) == ("complete", "workers_running")
    h.advance(299.0)  # now only silence ends it (no steps visible): 900 s after launch
    assert h.ops.sent(signal.SIGABRT) == []
    h.advance(1.0)
    assert h.ops.sent(signal.SIGABRT) == [h.pid]
    assert h.events("ending_run")[0].fields["why"] == "no_progress"


def test_restarts_torchrun_handles_are_counted_not_acted_on(harness: Any) -> None:
    """A worker failure and the agent's own restart: records and counts; dflashd restarts nothing."""
    h = harness({"command": TORCHRUN})
    run = h.daemon.run
    assert run is not None
    h.step(10)
    said = (
        AgentLine(AgentSaid.WORKER_FAILED, {"exit_code": -9, "local_rank": 0, "pid": 7}),
        AgentLine(
            AgentSaid.GROUP_RESTART, {"state": "FAILED", "attempts_left": 3, "max_restarts": 3}
        ),
        AgentLine(AgentSaid.RENDEZVOUS_WAIT),
        AgentLine(AgentSaid.RENDEZVOUS_DONE, {"group_rank": 1, "group_world_size": 2}),
    )
    h.daemon.inbox.post(LinesSeen(run.run_no, None, "agent", said))
    h.daemon.turn()
    assert h.events("worker_failed")[0].fields["exit_code"] == -9
    restarted = h.events("workers_restarted")[0].fields
    assert (restarted["by"], restarted["cause"], restarted["restarts"]) == (
        "torchrun",
        "failure",
        1,
    )
    assert [r.fields["state"] for r in h.events("rendezvous")][-2:] == ["waiting", "complete"]
    elastic = h.daemon.status()["elastic"]
    assert elastic is not None
    assert (elastic["restarts"], elastic["worker_failures"], elastic["group_rank"]) == (1, 1, 1)
    assert h.daemon.run is run and h.ops.signals == []
