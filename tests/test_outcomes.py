"""What the daemon does when a run ends, as one table through the model's reducer.

Each row is a history of runs ending (what was seen of each), played through
:func:`~dflashd.supervisor.model.step.step` as the loop would hear it (started, launched,
the child's death, the restart deadline, the release, the next launch), and what the last end
must bring: the verdict and its reason, what follows (a relaunch and its wait, the fatal end
and why, or the daemon done), the alerts sent and whether the compile caches are cleared.
No process, file, thread or clock: the real-process suites pin the adapters.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Any

import pytest

from dflashd.supervisor.model.deadlines import Deadline
from dflashd.supervisor.model.effects import (
    Effect,
    SendAlert,
    WriteRecord,
)
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.goodput import GoodputLedger, RunTimes
from dflashd.supervisor.model.inputs import (
    ChildExited,
    DeadlineDue,
    ReleaseLooked,
    Started,
    StopRequested,
)
from dflashd.supervisor.model.ledger import Ledger
from dflashd.supervisor.model.policy import RestartConfig
from dflashd.supervisor.model.runstate import RunFacts
from dflashd.supervisor.model.step import DaemonState, Rules, step
from dflashd.supervisor.model.verdicts import EndedBy, Observations, signal_name
from tests.tables import launch_heard

POLICY = RestartConfig(
    early_retries=2, runtime_retries=5, backoff_initial_s=2.0, no_progress_restarts=3
)
JITTER = 0.5  # the middle of the jitter: the backoff's own figure


@dataclass(frozen=True)
class End:
    """One run's end: what was seen, and what the daemon knew of it."""

    obs: Observations
    step: int | None = None
    progress_s: float = 0.0
    facts: dict[str, Any] = field(default_factory=dict)


def trained(step: int | None = 50, **seen: Any) -> Observations:
    return Observations(reached_first_step=True, output_lines=40, lived_s=120.0, **seen)


def early(*tail: str, **seen: Any) -> Observations:
    said: dict[str, Any] = {"exit_code": 1, "lived_s": 5.0, **seen}
    return Observations(output_lines=len(tail), stderr_tail=tail, **said)


SEGV = End(trained(signal=signal.SIGSEGV), step=50)
TRACEBACK = ('File "/home/u/train.py", line 9, in main', "ValueError: bad batch")
LIB_TRACEBACK = ('File "/usr/lib/python3/site-packages/x.py", line 9', "ValueError: bad")
SUMMARY = (
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
    "Root Cause (first observed failure):",
    "[0]:",
    "  exitcode  : 78 (pid: 4242)",
)


def play(
    ends: list[End], *, stop_before_last: bool = False
) -> tuple[DaemonState, list[Effect], float]:
    """Start, then each end in turn (relaunching when the daemon asks to); the last end's effects."""
    ledger = Ledger(goodput=GoodputLedger(first_start=1.0, gap_since=0.0))
    state = DaemonState(rules=Rules(policy=POLICY), ledger=ledger)
    now = 0.0
    state, _ = step(state, Started(), now)
    effects: tuple[Effect, ...] = ()
    for number, end in enumerate(ends, start=1):
        now += 0.1
        state, _ = step(state, launch_heard(now), now)
        started = now
        if stop_before_last and number == len(ends):
            state, _ = step(state, StopRequested(30.0, alive=True), now + 50.0)
        now += 60.0
        seen = end.obs.reached_first_step
        times = RunTimes(started, started + 1.0 if seen else None, now - 0.5)
        facts = RunFacts(
            number,
            end.obs,
            now - started,
            ended_at=1_800_000_000.0 + now,
            step=end.step,
            progress_s=end.progress_s,
            tail=end.obs.stderr_tail,
            times=times,
            died_mono=now,
            **end.facts,
        )
        state, effects = step(state, ChildExited(facts, jitter=JITTER), now)
        if number < len(ends):
            restart_at = state.deadlines.restart_at
            assert restart_at is not None, f"run {number} was not relaunched"
            now = restart_at
            state, _ = step(state, DeadlineDue(Deadline.RESTART), now)
            state, _ = step(state, ReleaseLooked(None), now)
    return state, list(effects), now


def what_follows(
    played: tuple[DaemonState, list[Effect], float],
) -> tuple[str, str, str, list[str], bool]:
    """(verdict, reason, what follows, alerts, caches cleared) of the last end: its effects
    and the state the reducer kept (the restart deadline, the loop's state and exit code)."""
    state, effects, now = played
    exit_record = next(e for e in effects if isinstance(e, WriteRecord) and e.event is Event.EXIT)
    alerts = [str(e.kind) for e in effects if isinstance(e, SendAlert)]
    cleared = state.ledger.clear_cache_next  # the next launch clears the caches first
    loop = state.loop
    if loop.done and loop.exit_code == 4:
        fatal = next(e for e in effects if isinstance(e, WriteRecord) and e.event is Event.FATAL)
        follows = f"fatal: {fatal.fields['reason']}"
    elif loop.done:
        follows = f"done: {loop.state}"
    else:
        assert state.deadlines.restart_at is not None
        follows = f"relaunch in {state.deadlines.restart_at - now:g}s"
    fields = exit_record.fields
    return str(fields["verdict"]), str(fields["reason"]), follows, alerts, cleared


# (id, history, verdict, reason, what follows, alerts, caches cleared)
ROWS: list[tuple[str, list[End], str, str, str, list[str], bool]] = [
    # one run, how it ended
    (
        "completed",
        [End(trained(exit_code=0), 90)],
        "completed",
        "exit_code_0",
        "done: completed",
        [],
        False,
    ),
    (
        "a segfault after new progress: at once",
        [SEGV],
        "crashed",
        "SIGSEGV",
        "relaunch in 0s",
        [],
        False,
    ),
    (
        "SIGKILL mid-training",
        [End(trained(signal=9), 50)],
        "crashed",
        "SIGKILL",
        "relaunch in 0s",
        [],
        False,
    ),
    (
        "a crash with no step number: backoff",
        [End(trained(signal=11), None)],
        "crashed",
        "SIGSEGV",
        "relaunch in 2s",
        [],
        False,
    ),
    (
        "a crash after a stable stretch: at once",
        [End(trained(signal=11), None, progress_s=700.0)],
        "crashed",
        "SIGSEGV",
        "relaunch in 0s",
        [],
        False,
    ),
    (
        "CUDA OOM mid-training",
        [
            End(
                trained(exit_code=1, stderr_tail=("torch.OutOfMemoryError: CUDA out of memory.",)),
                50,
            )
        ],
        "crashed",
        "cuda_oom",
        "relaunch in 0s",
        [],
        False,
    ),
    (
        "SIGABRT naming a CUDA error",
        [
            End(
                trained(
                    signal=6, stderr_tail=("RuntimeError: CUDA error: an illegal memory access",)
                ),
                50,
            )
        ],
        "crashed",
        "SIGABRT:cuda_error",
        "relaunch in 0s",
        [],
        False,
    ),
    (
        "the kernel's OOM killer",
        [End(trained(signal=9, oom_kills=1), 50)],
        "crashed",
        "oom_killed",
        "relaunch in 0s",
        [],
        False,
    ),
    (
        "an XID 79 explains the crash",
        [End(trained(signal=11, gpu_xids=(79,)), 50)],
        "crashed",
        "gpu_xid_79",
        "relaunch in 0s",
        [],
        False,
    ),
    (
        "its wait status lost",
        [End(trained(status_unknown=True), 50)],
        "crashed",
        "exit_status_unknown",
        "relaunch in 0s",
        [],
        False,
    ),
    (
        "exit 78 mid-training is fatal",
        [End(trained(exit_code=78), 50)],
        "crashed",
        "exit_code_78",
        "fatal: no_restart_exit_code_78",
        ["fatal"],
        False,
    ),
    (
        "a worker's 78 under torchrun",
        [End(trained(exit_code=1, stderr_tail=SUMMARY), 50)],
        "crashed",
        "ChildFailedError",
        "fatal: no_restart_exit_code_78_in_worker",
        ["fatal"],
        False,
    ),
    (
        "early: a RuntimeError",
        [End(early("RuntimeError: boom"))],
        "crash_before_first_step",
        "RuntimeError",
        "relaunch in 2s",
        ["crash_before_first_step"],
        False,
    ),
    (
        "early: nothing said",
        [End(early())],
        "silent_death",
        "exit_code_1",
        "relaunch in 2s",
        ["silent_death"],
        False,
    ),
    (
        "early: a segfault, nothing said",
        [End(Observations(signal=11, lived_s=3.0))],
        "silent_death",
        "SIGSEGV",
        "relaunch in 2s",
        ["silent_death"],
        False,
    ),
    (
        "early: an ImportError is unfixable",
        [End(early("ModuleNotFoundError: No module named 'flash_attn'"))],
        "crash_before_first_step",
        "import_error",
        "fatal: unfixable_import_error",
        ["fatal"],
        False,
    ),
    (
        "early: a SyntaxError is unfixable",
        [End(early("SyntaxError: invalid syntax"))],
        "crash_before_first_step",
        "syntax_error",
        "fatal: unfixable_syntax_error",
        ["fatal"],
        False,
    ),
    (
        "early: a compile config error is unfixable",
        [End(early("AttributeError: torch._dynamo.config has no attribute x"))],
        "crash_before_first_step",
        "compile_config_error",
        "fatal: unfixable_compile_config_error",
        ["fatal"],
        False,
    ),
    (
        "early: inductor named, caches cleared",
        [End(early("torch._inductor.exc.InductorError: CppCompileError"))],
        "crash_before_first_step",
        "InductorError",
        "relaunch in 2s",
        ["crash_before_first_step"],
        True,
    ),
    (
        "early: a build lock named, caches cleared",
        [End(early("waiting on /root/.cache/torch_extensions/py311/fused/lock"))],
        "crash_before_first_step",
        "exit_code_1",
        "relaunch in 2s",
        ["crash_before_first_step"],
        True,
    ),
    (
        "early: exit 78 is fatal",
        [End(early("config error", exit_code=78))],
        "crash_before_first_step",
        "exit_code_78",
        "fatal: no_restart_exit_code_78",
        ["fatal"],
        False,
    ),
    (
        "early: torchrun's own join timeout",
        [End(early("torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError"))],
        "rendezvous_timeout",
        "agent_join_timeout",
        "relaunch in 2s",
        ["rendezvous_timeout"],
        False,
    ),
    (
        "early but alive 5 min: a runtime crash",
        [End(Observations(signal=11, output_lines=9, lived_s=400.0))],
        "crashed",
        "SIGSEGV:no_step_seen",
        "relaunch in 2s",
        [],
        False,
    ),
    (
        "busy, then raised from its own code",
        [End(early(*TRACEBACK, cpu_s=30.0))],
        "crashed",
        "ValueError:no_step_seen",
        "relaunch in 2s",
        [],
        False,
    ),
    (
        "busy, raised from a library: early",
        [End(early(*LIB_TRACEBACK, cpu_s=30.0))],
        "crash_before_first_step",
        "ValueError",
        "relaunch in 2s",
        ["crash_before_first_step"],
        False,
    ),
    (
        "a stale build lock: fatal with its path",
        [End(early("RuntimeError: boom"), facts={"stale_build_locks": ("/x/lock",)})],
        "crash_before_first_step",
        "RuntimeError",
        "fatal: stale_build_lock:/x/lock",
        ["fatal"],
        False,
    ),
    (
        "the command could not be run",
        [End(Observations(spawn_error="No such file or directory: 'pyhton'"))],
        "spawn_failed",
        "No such file or directory: 'pyhton'",
        "fatal: spawn_failed",
        ["fatal"],
        False,
    ),
    # ended by dflashd
    (
        "stalled after new progress",
        [End(trained(signal=9, ended_by=EndedBy.NO_PROGRESS), 40)],
        "stalled",
        "no_progress",
        "relaunch in 0s",
        ["stalled"],
        False,
    ),
    (
        "proven hung",
        [End(trained(signal=9, ended_by=EndedBy.HUNG), 40)],
        "stalled",
        "hung",
        "relaunch in 0s",
        ["stalled"],
        False,
    ),
    (
        "hung after an XID 79",
        [End(trained(signal=9, ended_by=EndedBy.HUNG, gpu_xids=(79,)), 40)],
        "stalled",
        "gpu_xid_79",
        "relaunch in 0s",
        ["stalled"],
        False,
    ),
    (
        "no first step in time",
        [End(Observations(signal=9, ended_by=EndedBy.FIRST_STEP_TIMEOUT, output_lines=3))],
        "stalled",
        "first_step_timeout",
        "relaunch in 2s",
        ["stalled"],
        False,
    ),
    (
        "no GPU memory before the first step",
        [End(Observations(signal=9, ended_by=EndedBy.NO_GPU_MEMORY, output_lines=3))],
        "no_gpu_memory",
        "no_gpu_memory_before_first_step",
        "relaunch in 2s",
        ["no_gpu_memory"],
        False,
    ),
    (
        "torchrun waited past first_step_timeout",
        [End(Observations(signal=9, ended_by=EndedBy.RENDEZVOUS_TIMEOUT))],
        "rendezvous_timeout",
        "first_step_timeout_in_rendezvous",
        "relaunch in 2s",
        ["rendezvous_timeout"],
        False,
    ),
    (
        "diverged with on_diverge=stop",
        [End(trained(signal=9, ended_by=EndedBy.DIVERGED, diverged=(120, 110)), 120)],
        "diverged",
        "loss_diverged_at_step_120_last_good_110",
        "fatal: loss_diverged_at_step_120_last_good_110",
        ["fatal"],
        False,
    ),
    (
        "a crash after waiting on a peer",
        [
            End(
                trained(signal=6),
                40,
                facts={"waited_elsewhere": ("a collective: all_reduce", 320.0)},
            )
        ],
        "crashed",
        "SIGABRT, after waiting 320s on work elsewhere (a collective: all_reduce): a peer on another node was lost?",
        "relaunch in 0s",
        ["waiting"],
        False,
    ),
    # histories
    (
        "a crash loop before the first step: quiet, then fatal",
        [
            End(early("RuntimeError: a")),
            End(early("RuntimeError: b")),
            End(early("RuntimeError: c")),
        ],
        "crash_before_first_step",
        "RuntimeError",
        "fatal: early_retries_exhausted",
        ["fatal"],
        False,
    ),
    (
        "the second early death is quiet, backoff doubled",
        [End(early("RuntimeError: a")), End(early("RuntimeError: b"))],
        "crash_before_first_step",
        "RuntimeError",
        "relaunch in 4s",
        [],
        False,
    ),
    (
        "the same early death twice: caches cleared",
        [End(early("RuntimeError: boom at 0x7f01")), End(early("RuntimeError: boom at 0x7f99"))],
        "crash_before_first_step",
        "RuntimeError",
        "relaunch in 4s",
        [],
        True,
    ),
    (
        "no new progress: backoff begins",
        [SEGV, SEGV],
        "crashed",
        "SIGSEGV",
        "relaunch in 2s",
        [],
        False,
    ),
    (
        "no new progress twice: doubled",
        [SEGV, SEGV, SEGV],
        "crashed",
        "SIGSEGV",
        "relaunch in 4s",
        [],
        False,
    ),
    (
        "three runs stuck at step 50: fatal",
        [SEGV, SEGV, SEGV, SEGV],
        "crashed",
        "SIGSEGV",
        "fatal: no_progress_past_step_50",
        ["fatal"],
        False,
    ),
    (
        "new progress every time, out of runtime retries",
        [End(trained(signal=11), s) for s in (10, 20, 30, 40, 50, 60)],
        "crashed",
        "SIGSEGV",
        "fatal: runtime_retries_exhausted",
        ["fatal"],
        False,
    ),
    (
        "new progress again: at once",
        [SEGV, SEGV, End(trained(signal=11), 90)],
        "crashed",
        "SIGSEGV",
        "relaunch in 0s",
        [],
        False,
    ),
    (
        "a stall again before passing it: one page",
        [End(trained(signal=9, ended_by=EndedBy.NO_PROGRESS), 40)] * 2,
        "stalled",
        "no_progress",
        "relaunch in 2s",
        [],
        False,
    ),
    (
        "an early death after a run trained: alerted",
        [SEGV, End(early("RuntimeError: boom"))],
        "crash_before_first_step",
        "RuntimeError",
        "relaunch in 2s",
        ["crash_before_first_step"],
        False,
    ),
    (
        "completed after crashes",
        [SEGV, End(trained(exit_code=0), 100)],
        "completed",
        "exit_code_0",
        "done: completed",
        [],
        False,
    ),
]


@pytest.mark.parametrize(
    ("history", "verdict", "reason", "follows", "alerts", "cleared"),
    [row[1:] for row in ROWS],
    ids=[row[0] for row in ROWS],
)
def test_what_follows_a_runs_end(
    history: list[End], verdict: str, reason: str, follows: str, alerts: list[str], cleared: bool
) -> None:
    assert what_follows(play(history)) == (verdict, reason, follows, alerts, cleared)


@pytest.mark.parametrize(
    "last",
    [
        SEGV,
        End(early("RuntimeError: boom")),
        End(trained(exit_code=0), 90),
        End(Observations(signal=15, ended_by=EndedBy.STOP, reached_first_step=True), 50),
    ],
    ids=["crashed", "early", "completed", "stopped"],
)
def test_a_stop_asked_before_the_end_is_never_followed_by_a_relaunch(last: End) -> None:
    """Whatever the run died of once a stop was asked, the daemon ends: stopped, exit 0."""
    verdict, _, follows, _, cleared = what_follows(play([last], stop_before_last=True))
    assert follows == "done: stopped" and not cleared
    assert verdict == ("stopped" if last.obs.ended_by is EndedBy.STOP else verdict)


def test_signals_are_named_as_kill_l_names_them() -> None:
    """A death (or a stray signal to the daemon) by a real-time signal reads ``SIGRTMIN+3``,
    as ``kill -l`` names it, never a number that only the kernel's headers explain."""
    assert signal_name(signal.SIGSEGV) == "SIGSEGV"
    assert signal_name(signal.SIGRTMIN) == "SIGRTMIN"
    assert signal_name(signal.SIGRTMIN + 3) == "SIGRTMIN+3"
    assert signal_name(signal.SIGRTMAX) == "SIGRTMAX"
    assert signal_name(99) == "SIG99"
