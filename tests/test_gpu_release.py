"""The wait for a dead run's GPU memory before its relaunch, as histories through the pure
decider (model/gpurelease.py) and through ``step`` (issue 52: the shell only names who holds
what; the wait, the kill, the records and the timeout are the model's)."""

from __future__ import annotations

from dflashd.supervisor.model.deadlines import Deadline
from dflashd.supervisor.model.effects import Effect, KillHolders, SetTimer, WriteRecord
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.gpurelease import (
    FRESH_SAMPLE_WAIT_S,
    RELEASE_POLL_S,
    GpuHolders,
    ReleaseWait,
    release_step,
)
from dflashd.supervisor.model.inputs import DeadlineDue, ReleaseLooked, Started
from dflashd.supervisor.model.step import step
from tests.tables import launch_heard
from tests.test_histories import CRASH, died, fresh, kinds, play

OURS = ({"gpu": 0, "pid": 11, "mib": 900.0, "cmd": "python train.py"},)
STRANGER = ({"gpu": 1, "pid": 77, "mib": 500.0, "cmd": "jupyter"},)


def _held(*holders: dict[str, object], foreign: tuple[dict[str, object], ...] = ()) -> GpuHolders:
    return GpuHolders(True, holders, foreign)


LIMITS = (30.0, 2.0)  # the config's gpu_release_timeout_s and gpu_poll_s


def _events(effects: tuple[Effect, ...]) -> list[str]:
    return [e.event.value for e in effects if isinstance(e, WriteRecord)]


def test_transition_checks_off_to_relaunch_at_once() -> None:
    assert release_step(ReleaseWait(), None, 5.0, *LIMITS) == (ReleaseWait(), (), True)


def test_transition_no_sample_since_the_death_looks_again_soon() -> None:
    wait, effects, ready = release_step(ReleaseWait(), GpuHolders(False), 5.0, *LIMITS)
    assert not ready and wait == ReleaseWait()
    assert effects == (SetTimer(Deadline.RELEASE_CHECK, 5.0 + FRESH_SAMPLE_WAIT_S),)


def test_transition_held_to_killed_waited_for_then_released() -> None:
    """First seen held: named and its holders ended; looked at with each fresh sample; once
    let go, how long it took."""
    wait, effects, ready = release_step(ReleaseWait(), _held(*OURS), 10.0, *LIMITS)
    assert not ready and wait.since == 10.0
    assert _events(effects) == ["gpu_memory_held"]
    assert KillHolders((11,)) in effects
    assert effects[-1] == SetTimer(Deadline.RELEASE_CHECK, 10.0 + min(2.0, RELEASE_POLL_S))
    wait, effects, ready = release_step(
        wait, _held(*OURS), 10.25, *LIMITS
    )  # still held: no second kill
    assert not ready and wait.since == 10.0 and kinds(effects) == ["SetTimer"]
    wait, effects, ready = release_step(wait, _held(), 10.5, *LIMITS)
    assert ready and wait.since is None
    (released,) = effects
    assert isinstance(released, WriteRecord) and released.event is Event.GPU_MEMORY_RELEASED
    assert released.fields == {"waited_s": 0.5}


def test_transition_held_past_the_timeout_relaunches_anyway() -> None:
    wait, _, _ = release_step(ReleaseWait(), _held(*OURS), 10.0, *LIMITS)
    wait, effects, ready = release_step(wait, _held(*OURS), 40.0, *LIMITS)
    assert ready and wait.since is None
    assert _events(effects) == ["gpu_release_timeout"]
    timeout = effects[0]
    assert isinstance(timeout, WriteRecord) and timeout.fields["waited_s"] == 30.0


def test_transition_a_stranger_is_said_once_and_never_ended() -> None:
    wait, effects, ready = release_step(ReleaseWait(), _held(foreign=STRANGER), 10.0, *LIMITS)
    assert ready and _events(effects) == ["gpu_foreign_holder"]
    assert not any(isinstance(e, KillHolders) for e in effects)
    wait, effects, ready = release_step(wait, _held(foreign=STRANGER), 20.0, *LIMITS)
    assert ready and effects == ()  # said once per run


def test_through_step_a_relaunch_waits_for_the_memory_and_a_launch_forgets_the_stranger() -> None:
    state, _ = play(fresh(gpu_release_s=LIMITS), [(0.0, Started()), (0.1, launch_heard(0.1))])
    state, _ = step(state, died(1, CRASH, 60.0, started=0.1), 60.0)
    state, effects = step(state, DeadlineDue(Deadline.RESTART), 62.0)
    state, effects = step(state, ReleaseLooked(None, _held(*OURS, foreign=STRANGER)), 62.0)
    assert kinds(effects) == [
        "WriteRecord(gpu_foreign_holder)",
        "WriteRecord(gpu_memory_held)",
        "KillHolders",
    ]
    assert state.deadlines.release_check_at == 62.0 + RELEASE_POLL_S  # the timer, folded in
    state, effects = step(state, ReleaseLooked(None, _held(foreign=STRANGER)), 62.25)
    assert kinds(effects)[:2] == ["WriteRecord(gpu_memory_released)", "Launch"]
    assert state.gpu_release.foreign_said  # until the launch is heard
    state, _ = step(state, launch_heard(62.3, run_no=2), 62.3)
    assert state.gpu_release == ReleaseWait()
