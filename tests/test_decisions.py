"""Pure decisions as tables: classifier, restart policy, lifecycle, config, notify parsing."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from dflashd.supervisor.host.config import ConfigError, load_config, parse_config
from dflashd.supervisor.host.notify import parse_notify
from dflashd.supervisor.model.lifecycle import IllegalTransition, State, transition
from dflashd.supervisor.model.policy import (
    Action,
    RestartConfig,
    RestartHistory,
    backoff_delay,
    decide,
)
from dflashd.supervisor.model.verdicts import (
    ALERT_KINDS,
    EndedBy,
    Observations,
    Verdict,
    classify,
    reason_from_output,
)

SEGV = int(signal.SIGSEGV)


@pytest.mark.parametrize(
    ("obs", "verdict", "reason"),
    [
        (
            Observations(spawn_error="No such file or directory: nope"),
            Verdict.SPAWN_FAILED,
            "No such file or directory: nope",
        ),
        (Observations(exit_code=3), Verdict.SILENT_DEATH, "exit_code_3"),
        (
            Observations(
                exit_code=1,
                output_lines=4,
                stderr_tail=("ModuleNotFoundError: No module named 'x'",),
            ),
            Verdict.CRASH_BEFORE_FIRST_STEP,
            "import_error",
        ),
        (Observations(signal=SEGV, output_lines=1), Verdict.CRASH_BEFORE_FIRST_STEP, "SIGSEGV"),
        (
            Observations(signal=SEGV, reached_first_step=True, output_lines=9),
            Verdict.CRASHED,
            "SIGSEGV",
        ),
        (
            Observations(
                exit_code=1,
                reached_first_step=True,
                output_lines=9,
                stderr_tail=("torch.OutOfMemoryError: CUDA out of memory.",),
            ),
            Verdict.CRASHED,
            "cuda_oom",
        ),
        (Observations(exit_code=0), Verdict.COMPLETED, "exit_code_0"),
        (Observations(exit_code=0, reached_first_step=True), Verdict.COMPLETED, "exit_code_0"),
        (Observations(signal=15, ended_by=EndedBy.STOP), Verdict.STOPPED, "stop_requested"),
        (
            Observations(signal=6, ended_by=EndedBy.NO_PROGRESS, reached_first_step=True),
            Verdict.STALLED,
            "no_progress",
        ),
        (
            Observations(signal=6, ended_by=EndedBy.FIRST_STEP_TIMEOUT),
            Verdict.STALLED,
            "first_step_timeout",
        ),
        (
            Observations(signal=6, ended_by=EndedBy.NO_GPU_MEMORY),
            Verdict.NO_GPU_MEMORY,
            "no_gpu_memory_before_first_step",
        ),
        (
            Observations(exit_code=1, reached_first_step=True, output_lines=3, gpu_xids=(79,)),
            Verdict.CRASHED,
            "gpu_xid_79",
        ),
        (
            Observations(exit_code=1, reached_first_step=True, output_lines=3, gpu_xids=(13,)),
            Verdict.CRASHED,
            "exit_code_1",
        ),
        (  # the run cgroup's memory.events counted an OOM kill: the kernel's, not the job's
            Observations(signal=9, reached_first_step=True, output_lines=3, oom_kills=1),
            Verdict.CRASHED,
            "oom_killed",
        ),
        (  # a worker OOM-killed, the agent exiting 1 over it
            Observations(exit_code=1, output_lines=3, oom_kills=2),
            Verdict.CRASH_BEFORE_FIRST_STEP,
            "oom_killed",
        ),
        (  # a SIGSEGV in a run that also saw an OOM kill elsewhere stays a SIGSEGV
            Observations(signal=SEGV, reached_first_step=True, output_lines=3, oom_kills=1),
            Verdict.CRASHED,
            "SIGSEGV",
        ),
    ],
)
def test_classify_table(obs: Observations, verdict: Verdict, reason: str) -> None:
    """Each observation set maps to the docs/design.md verdict and a useful reason."""
    result = classify(obs)
    assert (result.verdict, result.reason) == (verdict, reason)


def test_reason_falls_back_to_the_exception_name() -> None:
    """An unknown exception is named by its class from the traceback's last line."""
    assert (
        reason_from_output(("Traceback (most recent call last):", "ValueError: bad shape"))
        == "ValueError"
    )
    assert reason_from_output(("just text",)) is None


POLICY = RestartConfig(
    early_retries=2,
    runtime_retries=3,
    stable_after_s=600,
    backoff_initial_s=1.0,
    backoff_max_s=10.0,
)


def _decide(
    verdict: Verdict,
    history: RestartHistory,
    *,
    first: bool = False,
    progress_s: float = 0.0,
    exit_code: int | None = 1,
    jitter: float = 0.5,
) -> object:
    return decide(
        verdict,
        exit_code=exit_code,
        reached_first_step=first,
        progress_s=progress_s,
        history=history,
        policy=POLICY,
        jitter=jitter,
    )


def test_early_budget_then_fatal() -> None:
    """Early deaths restart until the early budget is spent, then fatal; a first early death
    with no sign of the compile caches keeps them."""
    history = RestartHistory()
    actions = []
    for _ in range(3):
        decision = _decide(Verdict.CRASH_BEFORE_FIRST_STEP, history)
        history = decision.history  # type: ignore[attr-defined]
        actions.append((decision.action, decision.clear_cache))  # type: ignore[attr-defined]
    assert actions == [(Action.RESTART, False), (Action.RESTART, False), (Action.FATAL, False)]


INDUCTOR = (
    "Traceback (most recent call last):",
    '  File "/venv/lib/python3.11/site-packages/torch/_inductor/codecache.py", line 2034, in load',
    "torch._inductor.exc.CppCompileError: C++ compile error",
)
OWN_CODE = (
    "Traceback (most recent call last):",
    '  File "/work/train.py", line 88, in <module>',
    "ValueError: shapes (3, 4) and (5, 6) do not match",
)
STALE_LOCK = ("Waiting for lock on /root/.cache/torch_extensions/py311_cpu/cpu_adam/lock",)


@pytest.mark.parametrize(
    ("tails", "cleared"),
    [
        ([INDUCTOR], [True]),  # the traceback comes from inductor: cleared at once
        ([OWN_CODE], [False]),  # the job's own exception: caches kept
        ([STALE_LOCK], [True]),  # a build lock named
        ([OWN_CODE, OWN_CODE], [False, True]),  # the same early death twice in a row: cleared
        ([OWN_CODE, (*INDUCTOR[:2], "KeyError: 7")], [False, True]),
        ([OWN_CODE, ("RuntimeError: other",)], [False, False]),  # two different deaths: kept
    ],
)
def test_caches_are_cleared_when_the_evidence_points_at_them(
    tails: list[tuple[str, ...]], cleared: list[bool]
) -> None:
    history = RestartHistory()
    got = []
    for tail in tails:
        decision = decide(
            Verdict.CRASH_BEFORE_FIRST_STEP,
            exit_code=1,
            reached_first_step=False,
            progress_s=0.0,
            history=history,
            policy=RestartConfig(early_retries=5),
            jitter=0.5,
            tail=tail,
        )
        history = decision.history
        got.append(decision.clear_cache)
    assert got == cleared


def test_runtime_budget_is_separate_and_resets_after_stable_progress() -> None:
    """Runtime crashes have their own budget; stable_after_s of progress resets it and the backoff."""
    history = RestartHistory(early_deaths=2)
    for _ in range(3):
        decision = _decide(Verdict.CRASHED, history, first=True, progress_s=10)
        assert decision.action is Action.RESTART and not decision.clear_cache  # type: ignore[attr-defined]
        history = decision.history  # type: ignore[attr-defined]
    assert history.early_deaths == 0
    assert _decide(Verdict.CRASHED, history, first=True, progress_s=10).action is Action.FATAL  # type: ignore[attr-defined]
    stable = _decide(Verdict.CRASHED, history, first=True, progress_s=601)
    assert stable.action is Action.RESTART  # type: ignore[attr-defined]
    assert stable.history == RestartHistory(0, 1, 1, free_restart=True)  # type: ignore[attr-defined]


def test_a_crash_after_stable_progress_relaunches_at_once_then_backs_off() -> None:
    """The first runtime crash after stable_after_s of progress waits for nothing; the
    crashes that follow it back off from the initial delay, doubling."""
    delays = []
    history = RestartHistory()
    for progress_s in (601, 10, 10):  # (POLICY allows three runtime retries)
        decision = _decide(Verdict.CRASHED, history, first=True, progress_s=progress_s)
        delays.append(round(decision.delay_s, 3))  # type: ignore[attr-defined]
        history = decision.history  # type: ignore[attr-defined]
    assert delays == [0.0, 1.0, 2.0]
    early = _decide(Verdict.CRASH_BEFORE_FIRST_STEP, RestartHistory(), first=False, progress_s=601)
    assert early.delay_s == 1.0  # type: ignore[attr-defined]  # an early death still waits


@pytest.mark.parametrize("verdict", [Verdict.COMPLETED, Verdict.STOPPED])
def test_completed_and_stopped_never_restart(verdict: Verdict) -> None:
    """completed and stopped end supervision."""
    assert _decide(verdict, RestartHistory(), exit_code=0).action is Action.DONE  # type: ignore[attr-defined]


def test_no_restart_exit_code_is_fatal_in_any_phase() -> None:
    """Exit code 78 (EX_CONFIG) is fatal at once, before or after the first step."""
    for first in (False, True):
        decision = _decide(
            Verdict.CRASHED if first else Verdict.CRASH_BEFORE_FIRST_STEP,
            RestartHistory(),
            first=first,
            exit_code=78,
        )
        assert decision.action is Action.FATAL and decision.reason == "no_restart_exit_code_78"  # type: ignore[attr-defined]


def test_spawn_failed_is_fatal_at_once() -> None:
    """A launch that never ran is not retried."""
    assert _decide(Verdict.SPAWN_FAILED, RestartHistory(), exit_code=None).action is Action.FATAL  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("failures", "jitter", "expected"),
    [
        (1, 0.5, 1.0),
        (2, 0.5, 2.0),
        (3, 0.5, 4.0),
        (4, 0.0, 6.4),
        (4, 0.999999, 9.6),
        (5, 0.5, 10.0),
        (30, 0.9, 10.0),
    ],
)
def test_backoff_doubles_with_jitter_under_a_ceiling(
    failures: int, jitter: float, expected: float
) -> None:
    """Backoff doubles per failure, jitter is ±20 %, and the ceiling always holds."""
    assert backoff_delay(failures, POLICY, jitter) == pytest.approx(expected, rel=1e-4)


def test_lifecycle_rejects_illegal_edges() -> None:
    """The transition table allows the documented edges and raises on others."""
    assert transition(State.RUNNING, State.BACKOFF) is State.BACKOFF
    assert transition(State.BACKOFF, State.STARTING) is State.STARTING
    with pytest.raises(IllegalTransition):
        transition(State.STOPPED, State.RUNNING)
    with pytest.raises(IllegalTransition):
        transition(State.FATAL, State.RUNNING)


def test_notify_parsing() -> None:
    """sd_notify assignments parse like systemd does; junk is ignored."""
    msg = parse_notify(
        b"READY=1\nSTEP=120\nSTATUS=compiling worker 2\nEXTEND_TIMEOUT_USEC=5000000\nJUNK", 42
    )
    assert msg.ready and msg.step == 120 and msg.status == "compiling worker 2"
    assert msg.extend_timeout_us == 5_000_000 and msg.sender_pid == 42 and msg.is_progress
    assert parse_notify(b"STEP=abc").step is None
    assert not parse_notify(b"STATUS=hi").is_progress
    assert parse_notify(b"WATCHDOG=1").is_progress


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"comand": ["x"]}, "unknown config key 'comand'"),
        ({"restart": {"early_retires": 1}}, "unknown config key 'restart.early_retires'"),
        ({"gpu_poll_s": "fast"}, "gpu_poll_s: expected a number"),
        ({"gpu_poll_s": 0}, "gpu_poll_s: must be at least 0.05"),
        ({"stall_timeout_s": 0}, "stall_timeout_s: must be greater than 0"),
        ({"logs": {"max_bytes": 100}}, "logs.max_bytes: must be at least 1024"),
        ({"logs": {"max_line_bytes": 2}}, "logs.max_line_bytes: must be at least 4"),
        ({"restart": {"stop_timeout_s": 1e308}}, "restart.stop_timeout_s: must be at most"),
        ({"gpu_poll_s": float("nan")}, "gpu_poll_s: expected a finite number"),
        ({"alerts": {"webhook_url": "file:///etc/passwd"}}, "alerts.webhook_url: must be an http"),
        ({"gpus": "some"}, "gpus: expected"),
        ({"step_pattern": "step \\d+"}, "step_pattern: needs one group"),
        ({"first_step_pattern": "("}, "first_step_pattern: not a valid regex"),
        ({"alerts": {"on": ["crashd"]}}, "alerts.on: unknown alert kind 'crashd'"),
        ({"command": []}, "command: must not be empty"),
        ({"restart": {"early_retries": -1}}, "restart.early_retries: must be at least 0"),
    ],
)
def test_bad_config_names_the_key(data: dict[str, object], message: str) -> None:
    """Every config mistake is a ConfigError that names the key."""
    with pytest.raises(ConfigError, match=message.replace("\\", "\\\\").replace("(", "\\(")):
        parse_config(data)


def test_config_defaults_and_override(tmp_path: Path) -> None:
    """Defaults match docs/design.md ("Config"); `-- CMD` replaces the command; the default runs our trainer."""
    config = load_config(None)
    assert config.command[1:] == ("-m", "dflashd.trainer")
    assert config.restart.no_restart_exit_codes == (78,)
    assert config.logs.max_line_bytes == 65536
    path = tmp_path / "c.toml"
    path.write_text("gpus = [0, 1]\n[restart]\nbackoff_initial_s = 2\n")
    config = load_config(path, ("echo", "hi"))
    assert (
        config.gpus == (0, 1)
        and config.restart.backoff_initial_s == 2.0
        and config.command == ("echo", "hi")
    )


def test_alert_kinds_cover_every_verdict() -> None:
    """AlertKind is derived from the verdicts (``Verdict | Notice``): it never misses one."""
    from dflashd.supervisor.model.verdicts import Verdict

    extra = {
        "fatal",
        "recovered",
        "waiting",
        "slow",
        "gpu_unusable",
    }  # gave up; trains again; waits elsewhere; slow
    assert {v.value for v in Verdict} | extra == {k.value for k in ALERT_KINDS}


def test_the_same_hang_twice_is_fatal_not_a_third_try() -> None:
    """Issue 41: a hang with the same frames at the same step as the hang before stops with
    one alert (the fatal) instead of spending the restart budget on hanging again."""
    from dflashd.supervisor.model.policy import Action, RestartHistory, decide

    frames = ("worker rank 1 pid 4242: acquire (threading.py:320) <- load (data.py:88)",)

    def hung(history: RestartHistory, step: int, pid: int) -> object:
        seen = tuple(f.replace("4242", str(pid)) for f in frames)
        return decide(
            Verdict.STALLED,
            exit_code=None,
            reached_first_step=True,
            progress_s=120.0,
            history=history,
            policy=POLICY,
            jitter=0.5,
            reason="hung",
            step=step,
            frames=seen,
        )

    first = hung(RestartHistory(), 500, 4242)
    assert first.action is Action.RESTART  # type: ignore[attr-defined]
    again = hung(first.history, 500, 5151)  # type: ignore[attr-defined]
    assert again.action is Action.FATAL and again.reason == "same_hang_twice_at_step_500"  # type: ignore[attr-defined]
    elsewhere = hung(first.history, 900, 5151)  # type: ignore[attr-defined]
    assert elsewhere.action is Action.RESTART  # type: ignore[attr-defined]
