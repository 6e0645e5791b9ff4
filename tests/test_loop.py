"""The daemon's real logic driven by a manual clock and scripted children (no process is touched).

The kit (the harness, the scripted processes and custody) is tests/harness.py.
"""

from __future__ import annotations

import errno
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dflashd.supervisor.host.home import Home
from dflashd.supervisor.inbox import GpuSampled
from dflashd.supervisor.model.agent import AgentLine, AgentSaid
from dflashd.supervisor.model.gpurelease import FRESH_SAMPLE_WAIT_S, RELEASE_POLL_S
from dflashd.supervisor.model.inputs import LinesSeen
from dflashd.supervisor.model.lifecycle import State
from dflashd.supervisor.model.stacks import (
    ProcessStacks,
    Role,
    StackFrame,
    StacksDump,
    StacksTaken,
    ThreadStack,
)
from dflashd.supervisor.watch.nvml import GpuProcess, GpuReading, GpuSample
from tests.harness import Harness


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Any]:
    made: list[Harness] = []

    def make(config: dict[str, Any], sampler: Any = None, dumps: bool = False) -> Harness:
        h = Harness(tmp_path / "home", config, sampler, dumps)
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
    """The dead run still holds memory: a fresh sample is asked for at once (one from before
    the death proves nothing), its holder is SIGKILLed, and the relaunch follows the sample
    that shows the memory freed, a quarter second later, not a whole poll interval."""
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
    h.advance(1.0)  # the backoff is over; the last sample was taken before the death
    assert len(h.events("spawn")) == 1 and not h.events("gpu_memory_held")
    assert h.daemon.next_timeout() == pytest.approx(FRESH_SAMPLE_WAIT_S)
    h.daemon.inbox.post(GpuSampled(_sample(dead, 2400.0)))  # after the death: still held
    h.advance(FRESH_SAMPLE_WAIT_S)
    assert h.ops.sent(signal.SIGKILL) == [dead]
    assert h.events("gpu_memory_held")[0].fields["holders"][0]["pid"] == dead
    assert h.daemon.next_timeout() == pytest.approx(RELEASE_POLL_S)
    h.advance(RELEASE_POLL_S)
    assert len(h.events("spawn")) == 1  # the scripted sample still shows it
    h.daemon.inbox.post(GpuSampled(_sample(dead, 0.0)))
    h.advance(RELEASE_POLL_S)
    assert len(h.events("spawn")) == 2
    assert h.events("gpu_memory_released")[0].fields["waited_s"] == pytest.approx(
        2 * RELEASE_POLL_S
    )


def test_without_a_fresh_sample_the_last_one_decides_after_a_poll_interval(harness: Any) -> None:
    """No sample comes after the death (a poller stuck in NVML): after gpu_poll_s the last one
    is used, as before, so the relaunch is never held by a missing sample alone."""
    h = harness(
        {
            "gpus": "all",
            "gpu_poll_s": 2.0,
            "restart": {"backoff_initial_s": 1.0, "backoff_max_s": 1.0},
        },
        sampler=FixedSampler(),
    )
    h.daemon.inbox.post(GpuSampled(_sample(h.pid, 0.0)))
    h.output("warming")
    h.die(code=1)
    h.advance(1.0)
    assert len(h.events("spawn")) == 1
    h.advance(1.0)
    for _ in range(int(1.0 / FRESH_SAMPLE_WAIT_S) + 2):
        h.advance(FRESH_SAMPLE_WAIT_S)
    assert len(h.events("spawn")) == 2


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


def test_a_stall_then_a_resumed_step_alerts_only_what_alerts_on_names(harness: Any) -> None:
    """``alerts.on = ["fatal"]``: neither the stall nor the recovery pages anyone (a bug once:
    ``recovered`` was decided outside the alert rule)."""
    h = harness({"stall_timeout_s": 300.0, "alerts": {"on": ["fatal"]}})
    h.step(1)
    h.advance(300.0)
    assert h.ops.sent(signal.SIGABRT) == [h.pid]
    h.die(sig=signal.SIGKILL)
    assert h.events("exit")[-1].fields["verdict"] == "stalled"
    h.advance_to_next_timer()  # the relaunch
    h.step(1)
    assert h.events("first_step")[-1].run == 2
    assert h.alerts == []


def test_a_stall_then_a_resumed_step_pages_twice_by_default(harness: Any) -> None:
    """By default the stall pages, and so does the first step of the run after it, once."""
    h = harness({"stall_timeout_s": 300.0})
    h.step(1)
    h.advance(300.0)
    h.die(sig=signal.SIGKILL)
    h.advance_to_next_timer()
    h.step(1)
    h.step(2)
    # the recovery says what it recovered from (issue 54): the kind, the run, its end
    said = "recovered from stalled: run 1 stalled (no_progress) at step 1; training is at step 2"
    assert h.alerts == [("stalled", "no_progress"), ("recovered", said)], h.alerts
    assert h.daemon.ledger.recovering_from is None


def test_a_run_the_dead_daemon_never_saw_end_is_lost_and_counted(tmp_path: Path) -> None:
    """state.json says run 7 was running when its daemon died: the next daemon writes its
    ``exit`` (``lost``) through the same conclude -> apply, counts it, then launches run 8."""
    home = tmp_path / "home"
    Home(home).create()
    (home / "state.json").write_text(
        '{"state": "running", "run": 7, "step": 120, "restarts_by_verdict": {"crashed": 2},'
        ' "child": {"pid": 999999, "create_time": 1.0, "boot_id": "another-boot"}}'
    )
    h = Harness(home, {})
    try:
        lost = h.events("exit")
        assert [
            (r.run, r.fields["verdict"], r.fields["reason"], r.fields["step"]) for r in lost
        ] == [(7, "lost", "daemon_killed", 120)]
        status = h.daemon.status()
        assert status["restarts_by_verdict"] == {"crashed": 2, "lost": 1}
        assert status["last_exit"] is not None and status["last_exit"]["run"] == 7
        assert status["run"] == 8
    finally:
        h.close()


def _two_ranks(run_no: int, trigger: str) -> StacksDump:
    """Rank 0 waits in all_reduce; rank 1 is somewhere else: the odd rank out."""

    def proc(pid: int, rank: int, frames: list[StackFrame]) -> ProcessStacks:
        thread = ThreadStack(pid, "MainThread", False, False, tuple(frames))
        return ProcessStacks(pid, Role("worker", rank, rank), (thread,))

    waiting = [StackFrame("all_reduce", "torch/distributed/distributed_c10d.py", 2500)]
    frozen = [StackFrame("frozen_here", "train.py", 12), StackFrame("main", "train.py", 30)]
    return StacksDump(run_no, trigger, "py-spy", [proc(900, 0, waiting), proc(901, 1, frozen)])


def test_a_stall_dumps_the_stacks_before_the_kill(harness: Any) -> None:
    """With py-spy, a stall is dumped first (the job keeps running: no SIGABRT), killed once
    the dump is in, and the exit record and the alert carry where each rank was."""
    h = harness({"stall_timeout_s": 300.0}, dumps=True)
    h.step(1)
    h.advance(300.0)
    assert h.dumps.started == [(1, "no_progress", "1-1")]
    assert h.events("ending_run")[-1].fields["dump"] == "py-spy"
    assert h.ops.sent(signal.SIGABRT) == [] and h.ops.sent(signal.SIGKILL) == []
    h.daemon.inbox.post(StacksTaken(1, "1-1", _two_ranks(1, "no_progress")))
    h.daemon.turn()
    assert h.ops.sent(signal.SIGKILL) == [h.pid]
    stacks = h.events("stacks")[-1].fields
    assert stacks["odd_rank_out"] == [1] and "frozen_here" in stacks["odd_summary"]
    h.die(sig=signal.SIGKILL)
    exit_stacks = h.events("exit")[-1].fields["stacks"]
    assert exit_stacks["path"] == "/scripted/1-1.txt" and exit_stacks["odd_rank_out"] == [1]
    assert any("all_reduce" in line for line in exit_stacks["top"])
    assert h.alerts == [("stalled", "no_progress")]


def test_a_dump_past_its_bound_is_not_waited_for(harness: Any) -> None:
    """py-spy hangs: the kill goes ahead 10 s after the stall anyway."""
    h = harness({"stall_timeout_s": 300.0}, dumps=True)
    h.step(1)
    h.advance(300.0)
    h.advance(9.9)
    assert h.ops.sent(signal.SIGKILL) == []
    h.advance(0.1)
    assert h.ops.sent(signal.SIGKILL) == [h.pid]


def test_a_failed_dump_falls_back_to_faulthandler(harness: Any) -> None:
    """py-spy could not read the run: SIGABRT for faulthandler's dump, then the kill."""
    h = harness({"stall_timeout_s": 300.0}, dumps=True)
    h.step(1)
    h.advance(300.0)
    failed = StacksDump(1, "no_progress", "py-spy", error="Permission denied (os error 1)")
    h.daemon.inbox.post(StacksTaken(1, "1-1", failed))
    h.daemon.turn()
    assert h.ops.sent(signal.SIGABRT) == [h.pid]
    ending = h.events("ending_run")[-1].fields
    assert ending["dump"] == "faulthandler" and "Permission denied" in ending["py_spy"]
    h.advance(3.0)
    assert h.ops.sent(signal.SIGKILL) == [h.pid]
