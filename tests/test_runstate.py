"""The run's facts as a value the model replaces (issue 42): the stall and no-GPU-memory
deciders in ``step``'s arms, and each effect that changes what is known of the run, as
tables of inputs -> (facts, effects).  No process, pipe, file or clock."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import pytest

from dflashd.supervisor.model.effects import (
    DumpStacks,
    Effect,
    EndRun,
    EndRunHung,
    KeepStacks,
    SendAlert,
    StopRun,
    WriteRecord,
)
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.gpuuse import ChildGpuUse, holds_no_gpu_memory
from dflashd.supervisor.model.inputs import GpuSeen, LinesSeen, StallLook
from dflashd.supervisor.model.killing import STACKS_BOUND_S
from dflashd.supervisor.model.progress import LineProgress
from dflashd.supervisor.model.runstate import RunState, stall_decide
from dflashd.supervisor.model.step import DaemonState, Rules, fold, step
from dflashd.supervisor.model.verdicts import EndedBy, Notice
from tests.tables import launch_heard, run_state

GRACE = 60.0


def running(at: float = 0.0, **facts: object) -> DaemonState:
    """A daemon whose run 1 was launched at ``at``, with these facts."""
    state, _ = step(DaemonState(rules=Rules(vram_grace_s=GRACE)), launch_heard(at), at)
    assert state.run is not None
    return replace(state, run=replace(state.run, **facts))  # type: ignore[arg-type]


def test_the_runs_facts_are_a_value() -> None:
    facts = run_state(0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        facts.ended_by = EndedBy.STOP  # type: ignore[misc]
    assert facts.saw({7}).pids_seen == {7} and facts.pids_seen == frozenset()
    assert facts.saw(set()) is facts  # nothing new: the very same value


# -- the stall arm: (what the run is, what the host says) -> why it ends (None: alive) ---------

QUIET = run_state(0.0)  # no way to see steps: only silence and idleness end it
STEPS_SEEN = replace(QUIET, progress=replace(QUIET.progress, sees_steps=True))
RENDEZVOUS = replace(QUIET, progress=replace(QUIET.progress, rendezvous=True))
FIRST_STEP = replace(QUIET, progress=replace(QUIET.progress, first_step_mono=5.0, step=1))
USED_BEFORE = replace(QUIET, cpu_seen_s=4.0)

STALLS = {
    "silent, one process runnable: computing": (QUIET, True, 0.0, None),
    "silent, its CPU time grew since the last look: computing": (USED_BEFORE, False, 4.5, None),
    "silent, no CPU used since the last look: no progress": (
        USED_BEFORE,
        False,
        4.0,
        EndedBy.NO_PROGRESS,
    ),
    "silent, no custody to read the CPU of: no progress": (
        QUIET,
        False,
        None,
        EndedBy.NO_PROGRESS,
    ),
    "steps can be seen, none came: first step timeout": (
        STEPS_SEEN,
        True,
        9.0,
        EndedBy.FIRST_STEP_TIMEOUT,
    ),
    "a torchrun agent still in its rendezvous: rendezvous timeout": (
        RENDEZVOUS,
        True,
        9.0,
        EndedBy.RENDEZVOUS_TIMEOUT,
    ),
    "after its first step, the CPU proves nothing: no progress": (
        FIRST_STEP,
        True,
        9.0,
        EndedBy.NO_PROGRESS,
    ),
}


@pytest.mark.parametrize(
    ("facts", "runnable", "used", "ends"), list(STALLS.values()), ids=list(STALLS)
)
def test_the_stall_decider(
    facts: RunState, runnable: bool, used: float | None, ends: EndedBy | None
) -> None:
    after, why = stall_decide(facts, runnable=runnable, cpu_used_s=used, now=100.0)
    assert why is ends
    if why is None:  # alive: looked at again a period later, its CPU time remembered
        assert after.progress.last_alive_mono == 100.0 and after.cpu_seen_s == used


def test_the_stall_arm_ends_the_run_once_and_remembers_the_cpu_seen() -> None:
    state = running(cpu_seen_s=2.0)
    state, said = step(state, StallLook(1, runnable=False, cpu_used_s=3.0), 100.0)
    assert said == () and state.run is not None and state.run.cpu_seen_s == 3.0
    state, said = step(state, StallLook(1, runnable=False, cpu_used_s=3.0), 200.0)
    assert said == ending("no_progress")  # the dump, then the kill (model/killing.py)
    assert state.run is not None and state.run.ended_by is EndedBy.NO_PROGRESS
    assert step(state, StallLook(1, runnable=False, cpu_used_s=3.0), 300.0)[1] == ()
    assert step(running(), StallLook(2, False, 1.0), 100.0) == (running(), ())  # not this run


# -- the GPU arm: what a sample found the run holds -> its end ----------------------------------

NOTHING_HELD = ChildGpuUse({0: 0.0, 1: 0.0})
HOLDS = ChildGpuUse({0: 0.0, 1: 2048.0})
UNKNOWN = ChildGpuUse({0: None})

NO_GPU = {
    "past the grace, holding nothing: ended": (NOTHING_HELD, GRACE + 1, False, True),
    "within the grace: left alone": (NOTHING_HELD, GRACE - 1, False, False),
    "memory on one GPU: doing something": (HOLDS, GRACE + 1, False, False),
    "a figure NVML does not know is not zero": (UNKNOWN, GRACE + 1, False, False),
    "after its first step the rule is over": (NOTHING_HELD, GRACE + 1, True, False),
}


@pytest.mark.parametrize(("use", "at", "stepped", "ends"), list(NO_GPU.values()), ids=list(NO_GPU))
def test_the_no_gpu_memory_arm(use: ChildGpuUse, at: float, stepped: bool, ends: bool) -> None:
    assert (
        holds_no_gpu_memory(
            use, started_mono=0.0, grace_s=GRACE, reached_first_step=stepped, now=at
        )
        is ends
    )
    state = running()
    assert state.run is not None
    if stepped:
        progress = replace(state.run.progress, first_step_mono=1.0)
        state = replace(state, run=replace(state.run, progress=progress))
    gpus = ({"index": 0, "memory_used_mib": 0.0},)
    record = WriteRecord(Event.GPU, {"gpus": list(gpus)})
    state, said = step(state, GpuSeen(1, (record,), gpus, use=use), at)
    assert state.run is not None and state.run.gpu_seen == "idle"  # no kernel ran
    assert (state.run.ended_by, state.run.dump_before_kill) == (
        (EndedBy.NO_GPU_MEMORY, "1-1") if ends else (EndedBy.CHILD, None)
    )
    if not ends:
        assert said == (record,)
        return
    snapshot = WriteRecord(Event.GPU_SNAPSHOT, {"gpus": [dict(gpus[0])], "method": "process"})
    assert said == (record, snapshot, *ending("no_gpu_memory"))
    assert step(state, GpuSeen(1, (), gpus, use=use), at + 1)[1] == ()  # once


# -- the effects that change what is known of the run -------------------------------------------

STACKS = {"dump_id": "1-3", "top": ["main: train_step"]}

FOLDS: dict[str, tuple[RunState, tuple[Effect, ...], dict[str, object], int]] = {
    # (the run before, effects handed in, its facts after, how many effects go on to act)
    "an alert sent is remembered (a resumed run alerts once)": (
        run_state(0.0),
        (SendAlert(Notice.SLOW, "1.5x", {}),),
        {"alerted": frozenset({Notice.SLOW})},
        1,
    ),
    "a stop ends the run as stopped (its record, SIGTERM, SIGCONT)": (
        run_state(0.0),
        (StopRun(30.0),),
        {"ended_by": EndedBy.STOP},
        3,
    ),
    "a stop after dflashd ended it keeps the first reason": (
        replace(run_state(0.0), ended_by=EndedBy.NO_PROGRESS),
        (StopRun(30.0),),
        {"ended_by": EndedBy.NO_PROGRESS},
        3,
    ),
    "an end decided twice is carried out once (its dump, its record)": (
        run_state(0.0),
        (EndRun(EndedBy.DIVERGED), EndRun(EndedBy.NO_PROGRESS)),
        {"ended_by": EndedBy.DIVERGED, "dump_before_kill": "1-1"},
        2,
    ),
    "a proven hang says how long it hung": (
        run_state(0.0),
        (EndRunHung("all waiting", ("wait",), 38.0),),
        {"ended_by": EndedBy.HUNG, "hung_after_s": 38.0},
        1,
    ),
    "the kill waits for the dump taken before it": (
        run_state(0.0),
        (DumpStacks("no_progress", "1-3", before_kill=True),),
        {"dump_before_kill": "1-3"},
        1,
    ),
    "a command's dump is waited for by nobody": (
        run_state(0.0),
        (DumpStacks("command", "1-4"),),
        {"dump_before_kill": None},
        1,
    ),
    "that dump kept: the exit says its file and frames": (
        replace(run_state(0.0), dump_before_kill="1-3"),
        (KeepStacks(STACKS),),
        {"dump_before_kill": None, "stacks": STACKS},
        0,
    ),
}


@pytest.mark.parametrize(
    ("before", "effects", "after", "acting"), list(FOLDS.values()), ids=list(FOLDS)
)
def test_what_an_effect_changes_in_the_runs_facts(
    before: RunState, effects: tuple[Effect, ...], after: dict[str, object], acting: int
) -> None:
    state = replace(running(), run=before)
    state, said = fold(state, effects, 1.0)
    assert state.run is not None
    assert {name: getattr(state.run, name) for name in after} == after
    assert len(said) == acting


def test_a_reading_of_a_run_that_is_no_longer_current_changes_nothing() -> None:
    state, _ = step(running(), launch_heard(50.0, run_no=2), 50.0)
    stale = LinesSeen(1, LineProgress(3, True, "pattern", loss=1.0), "step 3 loss 1.0")
    assert step(state, stale, 51.0) == (state, ())
    # nor does run 1's last GPU sample end run 2, whatever run 1 held: its records only
    record = WriteRecord(Event.GPU, {"gpus": []})
    late = GpuSeen(1, (record,), ({"index": 0},), use=NOTHING_HELD)
    assert step(state, late, 50.0 + GRACE + 1) == (state, (record,))


def test_a_diverged_loss_with_stop_ends_the_run_through_the_model() -> None:
    state = replace(running(), rules=Rules(vram_grace_s=GRACE, on_diverge="stop"))
    said: tuple[Effect, ...] = ()
    for step_no, loss in enumerate([2.0, 1.9, 1.8, float("nan"), float("nan"), float("nan")]):
        found = LineProgress(step_no + 1, step_no == 0, "pattern", loss=loss)
        line = f"step {step_no + 1} loss {loss}"
        state, said = step(state, LinesSeen(1, found, line), 60.0 + step_no)
    diverged = [e for e in said if isinstance(e, WriteRecord) and e.event is Event.DIVERGED]
    assert [e.fields["then"] for e in diverged] == ["stop"]
    assert said[said.index(diverged[0]) + 1 : said.index(diverged[0]) + 3] == ending("diverged")
    assert state.run is not None and state.run.ended_by is EndedBy.DIVERGED
    assert state.run.diverged is not None and state.run.diverged["step"] == 4
    assert state.ledger.diverged_at == 4  # a relaunch diverging here again ends, too


def ending(why: str) -> tuple[Effect, ...]:
    """What an end dflashd decided is folded into: the dump (named by the model), its record;
    the kill's bound is a timer in the state."""
    fields = {"why": why, "dump": "py-spy", "then": "SIGKILL", "bound_s": STACKS_BOUND_S}
    return (
        DumpStacks(why, "1-1", before_kill=True),
        WriteRecord(Event.ENDING_RUN, fields, log_level="warning"),
    )


@pytest.mark.parametrize(
    ("alive_at", "step_at", "duration", "cpu", "lived"),
    [
        (None, None, 30.0, None, 0.0),  # nothing seen, CPU unknown: it never lived
        (12.0, None, 30.0, 0.5, 12.0),  # output until 12 s: it lived 12 s
        (12.0, 20.0, 30.0, 0.5, 20.0),  # a step at 20 s is a sign of life too
        (None, None, 400.0, 41.0, 400.0),  # silent but a tenth of a CPU busy: all of it
        (None, None, 400.0, 39.0, 0.0),  # silent, under a tenth: no sign of life
    ],
)
def test_how_long_a_run_lived_tells_an_early_death_from_a_crash(
    alive_at: float | None, step_at: float | None, duration: float, cpu: float | None, lived: float
) -> None:
    """Issue 52: the rule once computed in the shell (reaped.py) is the model's."""
    facts = run_state(0.0)
    progress = replace(facts.progress, last_alive_mono=alive_at, last_progress_mono=step_at)
    assert replace(facts, progress=progress).lived_s(duration, cpu) == lived
