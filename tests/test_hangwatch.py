"""The hang watch's arms as tables: what each decider action makes of a run's watch.

:mod:`dflashd.supervisor.model.hangwatch` carries out ``hang.decide`` and
``startup_decide``: the next watch (a value) and the effects, by name.  No process, clock or
file: the real hangs are tests/test_hangs.py's and tests/multinode/'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import pytest

from dflashd.supervisor.model.deadlines import Deadline
from dflashd.supervisor.model.effects import Effect, SampleStacks, SendAlert, SetTimer, WriteRecord
from dflashd.supervisor.model.hang import EndHung, HangAction, HangWatch, NewRound, TakeSample, Wait
from dflashd.supervisor.model.hangwatch import (
    after_progress,
    hang_arm,
    next_look,
    sampled,
    startup_arm,
    startup_named,
)
from dflashd.supervisor.model.judge import Finding, Judgement, Sample
from dflashd.supervisor.model.stacks import StacksDump
from dflashd.supervisor.model.startup import StartupAction, StartupStuck
from dflashd.supervisor.model.world import Share
from tests.tables import launch_heard

NOW, WALL = 100.0, 1_800_000_100.0
SAMPLE = Sample(at=90.0, processes=())
WORKING = Judgement(Finding.WORKING, "pid 7 computes in evaluate")
ELSEWHERE = Judgement(Finding.ELSEWHERE, "a collective: barrier", ("barrier (dist.py:1)",))
GPU = Judgement(Finding.GPU_WAIT, "every process waits on its busy GPU", key=42)
HUNG = Judgement(Finding.HUNG, "every thread waits, unmoved", ("acquire (train.py:9)",))
SHARE = Share("127.0.0.1:29400", "job", 0, 2, "working", 0.0, "")


def names(effects: Sequence[Effect]) -> list[str]:
    out = []
    for e in effects:
        if isinstance(e, WriteRecord):
            out.append(f"record {e.event.value}")
        elif isinstance(e, SendAlert):
            out.append(f"alert {e.kind}")
        elif isinstance(e, SetTimer):
            out.append(f"look at {e.at}")
        else:
            out.append(type(e).__name__)
    return out


Check = Callable[[HangWatch], bool]
ROUND = HangWatch(samples=(SAMPLE, SAMPLE, SAMPLE), sampling=False, rounds=1)

# (id, watch before, action, next look set now, effects by name, a check of the watch after)
ROWS: list[tuple[str, HangWatch, HangAction, float | None, list[str], Check]] = [
    (
        "nothing to do until 130",
        HangWatch(),
        Wait(130.0),
        None,
        ["look at 130.0"],
        lambda w: w.rounds == 0,
    ),
    ("still the same look", HangWatch(), Wait(130.0), 130.0, [], lambda w: w.rounds == 0),
    (
        "nothing to wait for",
        HangWatch(),
        Wait(None),
        130.0,
        ["look at None"],
        lambda w: w.rounds == 0,
    ),
    (
        "a round begins",
        HangWatch(),
        TakeSample(),
        130.0,
        ["look at None", "record hang_suspect", "SampleStacks"],
        lambda w: w.rounds == 1 and w.sampling,
    ),
    (
        "the round's next sample",
        HangWatch(samples=(SAMPLE,), rounds=1),
        TakeSample(),
        None,
        ["SampleStacks"],
        lambda w: w.rounds == 1 and w.sampling,
    ),
    (
        "work found: look again later",
        ROUND,
        NewRound(WORKING, 115.0),
        None,
        ["look at 115.0", "record hang_check"],
        lambda w: w.samples == () and w.last_kind is Finding.WORKING and w.waiting is None,
    ),
    (
        "the same finding again: no record",
        replace(ROUND, last_finding=WORKING.why),
        NewRound(WORKING, 115.0),
        None,
        ["look at 115.0"],
        lambda w: w.last_finding == WORKING.why,
    ),
    (
        "waiting elsewhere: said in status, no alert yet",
        ROUND,
        NewRound(ELSEWHERE, 115.0),
        None,
        ["look at 115.0", "record hang_check"],
        lambda w: (
            w.elsewhere_since == NOW
            and w.waiting["kind"] == "elsewhere"
            and not w.elsewhere_alerted
        ),
    ),
    (
        "waiting elsewhere long enough: one alert",
        replace(ROUND, elsewhere_since=-200.0, last_finding=ELSEWHERE.why),
        NewRound(ELSEWHERE, 115.0, alert=True),
        None,
        ["look at 115.0", "alert waiting"],
        lambda w: (
            w.elsewhere_alerted and w.elsewhere_since == -200.0 and w.elsewhere_last[1] == -200.0
        ),
    ),
    (
        "back to work: the wait elsewhere is over",
        replace(
            ROUND,
            elsewhere_since=50.0,
            elsewhere_alerted=True,
            waiting={"kind": "elsewhere"},
            elsewhere_last=("barrier", 50.0, 90.0),
        ),
        NewRound(WORKING, 115.0),
        None,
        ["look at 115.0", "record hang_check"],
        lambda w: (
            w.elsewhere_since is None
            and not w.elsewhere_alerted
            and w.waiting is None
            and w.elsewhere_last is not None
        ),  # kept until a step: a rank whose peer was lost looks busy before it dies
    ),
    (
        "a GPU wait: remembered from now",
        ROUND,
        NewRound(GPU, 115.0),
        None,
        ["look at 115.0", "record hang_check"],
        lambda w: w.gpu_wait == (42, NOW),
    ),
    (
        "the same GPU wait: since when it began",
        replace(ROUND, gpu_wait=(42, 40.0)),
        NewRound(GPU, 115.0),
        None,
        ["look at 115.0", "record hang_check"],
        lambda w: w.gpu_wait == (42, 40.0),
    ),
    (
        "proven hung: the kill is the caller's",
        ROUND,
        EndHung(HUNG, 21.0),
        115.0,
        ["look at None"],
        lambda w: w.last_finding == HUNG.why,
    ),
]


@pytest.mark.parametrize(
    ("before", "action", "hang_at", "effects", "after"),
    [row[1:] for row in ROWS],
    ids=[row[0] for row in ROWS],
)
def test_what_a_hang_action_makes_of_the_watch(
    before: HangWatch, action: HangAction, hang_at: float | None, effects: list[str], after: Check
) -> None:
    watch, said = hang_arm(before, action, NOW, WALL, hang_at, share=SHARE, suspect={"step": 9})
    assert names(said) == effects
    assert after(watch), watch


def test_a_round_shares_its_finding_and_numbers_its_suspicion() -> None:
    _, said = hang_arm(
        HangWatch(rounds=2), TakeSample(), NOW, WALL, None, share=SHARE, suspect={"step": 9}
    )
    record = next(e for e in said if isinstance(e, WriteRecord))
    assert record.fields == {"step": 9, "round": 3} and record.log_level == "warning"
    assert next(e for e in said if isinstance(e, SampleStacks)).share == SHARE


def test_a_wait_elsewhere_says_since_when_in_wall_time() -> None:
    before = replace(ROUND, elsewhere_since=40.0)
    watch, _ = hang_arm(before, NewRound(ELSEWHERE, 115.0), NOW, WALL, None)
    assert watch.waiting is not None and watch.waiting["since"] == WALL - 60.0
    assert watch.waiting["frames"] == ["barrier (dist.py:1)"]


@pytest.mark.parametrize(
    ("watch", "last_progress", "expected"),
    [
        (
            HangWatch(waiting={"kind": "startup"}),
            5.0,
            lambda w: w.waiting is None,
        ),  # a first step after all
        (
            HangWatch(waiting={"kind": "elsewhere"}, rounds=1),
            5.0,
            lambda w: w.waiting == {"kind": "elsewhere"},
        ),
        (
            HangWatch(next_round_at=50.0),
            5.0,
            lambda w: w.next_round_at is None,
        ),  # a start-up's round
        (HangWatch(next_round_at=50.0, rounds=2), 5.0, lambda w: w.next_round_at == 50.0),
        (
            HangWatch(samples=(SAMPLE,), rounds=1, gpu_wait=(1, 2.0)),
            95.0,
            lambda w: w.samples == () and w.gpu_wait is None,
        ),
        (
            HangWatch(samples=(SAMPLE,), rounds=1),
            80.0,
            lambda w: w.samples == (SAMPLE,),
        ),  # older step
        (
            HangWatch(
                waiting={"kind": "elsewhere"},
                elsewhere_since=10.0,
                elsewhere_alerted=True,
                elsewhere_last=("a lock held by pid 9", 10.0, 40.0),
                rounds=3,
            ),
            45.0,
            lambda w: (
                (w.elsewhere_since, w.elsewhere_last, w.waiting) == (None, None, None)
                and not w.elsewhere_alerted
            ),
        ),  # a step after the wait's last round: it ended (the next wait is timed afresh)
        (
            HangWatch(
                waiting={"kind": "elsewhere"},
                elsewhere_since=10.0,
                elsewhere_last=("a lock held by pid 9", 10.0, 40.0),
                rounds=3,
            ),
            35.0,
            lambda w: w.elsewhere_since == 10.0 and w.elsewhere_last is not None,
        ),  # the step before it: the wait goes on
    ],
    ids=[
        "startup wait over",
        "elsewhere kept",
        "startup round dropped",
        "hang round kept",
        "stale round",
        "fresh round",
        "wait ended by a step",
        "wait goes on",
    ],
)
def test_what_a_new_step_leaves_of_the_watch(
    watch: HangWatch, last_progress: float, expected: Check
) -> None:
    after = after_progress(watch, last_progress)
    assert expected(after), after


@pytest.mark.parametrize(
    ("action", "effects", "stuck"),
    [
        (Wait(60.0), ["look at 60.0"], False),
        (TakeSample(), ["look at None", "SampleStacks"], False),
        (NewRound(WORKING, 80.0), ["look at 80.0"], False),
        (StartupStuck(HUNG), ["look at None"], True),
    ],
    ids=["wait", "sample", "new round", "stuck"],
)
def test_what_a_startup_action_makes_of_the_watch(
    action: StartupAction, effects: list[str], stuck: bool
) -> None:
    _, said, named = startup_arm(HangWatch(samples=(SAMPLE,)), action, 30.0)
    assert names(said) == effects and (named is not None) is stuck


def test_a_stuck_startup_is_named_once_with_its_stale_lock() -> None:
    held = [{"path": "/root/.cache/torch_extensions/fused/lock", "age_s": 4000.0}]
    watch, said = startup_named(HangWatch(), HUNG, held, WALL)
    assert names(said) == ["record hang_check", "alert waiting"]
    assert watch.waiting is not None and watch.waiting["stale_build_locks"] == held
    assert "remove it" in watch.waiting["hint"] and watch.waiting["since"] == WALL


def test_a_sample_joins_its_round_and_the_next_look_moves_only_when_it_changes() -> None:
    dump = StacksDump(1, "hang", "py-spy")
    watch = sampled(HangWatch(samples=(SAMPLE,), sampling=True), SAMPLE, dump)
    assert watch.samples == (SAMPLE, SAMPLE) and not watch.sampling and watch.last_dump is dump
    assert next_look(10.0, 10.0) == () and next_look(None, 10.0) == (SetTimer(Deadline.HANG, 10.0),)


@pytest.mark.parametrize(
    ("readings", "share"),
    [
        ([(600.0, True)] * 3 + [(120.0, False)], 0.2),  # a kernel spinning at near-idle power
        ([(600.0, True)] * 3 + [(590.0, False)], 590.0 / 600.0),  # an eval draws what training drew
        ([(600.0, True)] * 2 + [(120.0, False)], None),  # too few readings while stepping
        ([(600.0, True)] * 3 + [(None, False)], None),  # no reading now
        ([(600.0, True)] * 70 + [(300.0, True)] * 60 + [(150.0, False)], 0.5),  # the last 60 count
    ],
    ids=["spinning", "eval", "too few", "no reading", "recent stepping"],
)
def test_the_power_a_runs_gpus_draw_against_their_stepping_power(
    readings: list[tuple[float | None, bool]], share: float | None
) -> None:
    from dflashd.supervisor.model.gpuspin import PowerSeen

    seen = PowerSeen()
    for watts, stepping in readings:
        seen = seen.take(watts, stepping)
    assert seen.share() == (pytest.approx(share) if share is not None else None)


# -- through the reducer: the model keeps the watch, the shell only looks -----------------


def _hung_process() -> object:
    from dflashd.supervisor.model.stacks import ProcessStacks, Role, StackFrame, ThreadStack
    from dflashd.supervisor.model.world import ProcessSample

    frames = (StackFrame("acquire", "threading.py", 100), StackFrame("train", "train.py", 42))
    thread = ThreadStack(7, "MainThread", False, False, frames)
    return ProcessSample(ProcessStacks(7, Role("root"), (thread,)), 0, ("S",), 0.0)


def test_a_steady_run_that_stops_stepping_is_sampled_proven_hung_and_ended() -> None:
    """Looks at a run stepping every second, then silent: the model takes a round of three
    samples as they come back and ends the run as hung; the shell never holds the watch."""
    from dflashd.supervisor.model.effects import EndRunHung
    from dflashd.supervisor.model.hang import HangLimits, HangView
    from dflashd.supervisor.model.inputs import HangLook, Started
    from dflashd.supervisor.model.step import DaemonState, step

    state, _ = step(DaemonState(), Started(), 0.0)
    state, _ = step(state, launch_heard(0.1), 0.1)
    state = replace(state, hang=replace(state.hang, quick_for=50.0))  # its quick look was had
    view = HangView(50.0, (1.0,) * 10, True, True)
    limits = HangLimits(12.0, 300.0)

    def look(at: float, sample: Sample | None = None) -> list[Effect]:
        nonlocal state
        dump = StacksDump(1, "hang", "py-spy")
        came = (sample, dump) if sample is not None else None
        state, effects = step(state, HangLook(view, None, limits, WALL, None, 9, came), at)
        return list(effects)

    assert names(look(55.0)) == []  # 5 s without a step: nothing yet (the look is set for 62)
    assert state.deadlines.hang_at == 62.0
    began = look(62.0)
    assert names(began) == ["record hang_suspect", "SampleStacks"] and state.hang.sampling
    hung = Sample(62.0, (_hung_process(),))  # type: ignore[arg-type]
    assert names(look(62.5, hung)) == []  # the next sample at 65
    assert len(state.hang.samples) == 1 and state.deadlines.hang_at == 65.0
    look(65.0)
    look(65.5, Sample(65.0, (_hung_process(),)))  # type: ignore[arg-type]
    look(68.0)
    ended = look(68.5, Sample(68.0, (_hung_process(),)))  # type: ignore[arg-type]
    end = next(e for e in ended if isinstance(e, EndRunHung))
    assert end.hung_after_s == 18.5 and "acquire" in " ".join(end.frames)
    assert state.hang.last_finding == end.why
    state, _ = step(state, launch_heard(70.0), 70.0)  # the next run starts with no evidence
    assert state.hang == HangWatch()


def _drive(
    state: object, view: object, make: object, start: float, stop: float
) -> tuple[object, list[Effect], float | None]:
    """Look at the run every 0.25 s from ``start``; a sample asked for comes back at the next
    look (made by ``make(at)``).  The state, every effect, and when the run was ended."""
    from dflashd.supervisor.model.effects import EndRunHung
    from dflashd.supervisor.model.hang import HangLimits
    from dflashd.supervisor.model.inputs import HangLook
    from dflashd.supervisor.model.step import step

    limits = HangLimits(12.0, 300.0)
    said: list[Effect] = []
    at = start
    while at < stop:
        came = None
        if state.hang.sampling:  # type: ignore[attr-defined]
            came = (make(at - 0.1), StacksDump(1, "hang", "py-spy"))  # type: ignore[operator]
        state, effects = step(state, HangLook(view, None, limits, WALL, None, 9, came), at)  # type: ignore[arg-type]
        said += effects
        if any(isinstance(e, EndRunHung) for e in effects):
            return state, said, at
        at = round(at + 0.25, 3)
    return state, said, None


def _quiet(at: float) -> Sample:
    """Every thread in a lock, no CPU, no byte read or written: nothing moves at all."""
    from dflashd.supervisor.model.stacks import ProcessStacks, Role, StackFrame, ThreadStack
    from dflashd.supervisor.model.world import ProcessSample

    frames = (StackFrame("acquire", "threading.py", 100), StackFrame("train", "train.py", 42))
    thread = ThreadStack(7, "MainThread", False, False, frames)
    stacks = ProcessStacks(7, Role("root"), (thread,))
    return Sample(at, (ProcessSample(stacks, 0, ("S",), 0.0, read_bytes=0),))


def test_a_quiet_hang_is_decided_by_the_quick_look_within_ten_seconds() -> None:
    """Issue 51: a run stepping every second, then every thread in a lock with no CPU and no
    I/O: looked at 4 s after its last step, three samples a second apart, ended ~7 s after
    its last step (the long path took 18 s)."""
    from dflashd.supervisor.model.hang import HangView
    from dflashd.supervisor.model.inputs import Started
    from dflashd.supervisor.model.step import DaemonState, step

    state, _ = step(DaemonState(), Started(), 0.0)
    state, _ = step(state, launch_heard(0.1), 0.1)
    view = HangView(50.0, (1.0,) * 10, True, True)
    _state, said, ended = _drive(state, view, _quiet, 51.0, 80.0)
    assert ended is not None and ended - 50.0 <= 8.0, (ended, names(said))
    assert "record hang_suspect" not in names(said)  # a quick look says nothing until it ends


def test_a_torchrun_restart_round_starts_the_judgment_afresh_and_a_later_hang_is_still_found() -> (
    None
):
    """A round under way (one sample taken, a wait elsewhere on record) when torchrun restarts
    its workers: the round's samples and the wait are forgotten, suspicion is timed from the
    restart (not the last step before it), and the new group's own hang is still proven
    (here by the long path: its samples cannot say what it read, so the quick look yields)."""
    from dataclasses import replace as with_

    from dflashd.supervisor.model.hang import HangLimits, HangView
    from dflashd.supervisor.model.inputs import HangLook, Started
    from dflashd.supervisor.model.step import DaemonState, step

    state, _ = step(DaemonState(), Started(), 0.0)
    state, _ = step(state, launch_heard(0.1), 0.1)
    state = with_(state, hang=with_(state.hang, quick_for=50.0))
    view = HangView(50.0, (1.0,) * 10, True, True)
    limits = HangLimits(12.0, 300.0)

    def look(at: float, sample: Sample | None = None) -> list[Effect]:
        nonlocal state
        came = (sample, StacksDump(1, "hang", "py-spy")) if sample is not None else None
        state, effects = step(state, HangLook(view, None, limits, WALL, None, 9, came), at)
        return list(effects)

    look(62.0)
    look(62.5, Sample(62.0, (_hung_process(),)))  # type: ignore[arg-type]
    state = with_(
        state, hang=with_(state.hang, elsewhere_since=20.0, waiting={"kind": "elsewhere"})
    )
    view = with_(view, worker_rounds=1, restarted_at=64.0)  # the group re-formed at 64
    assert names(look(65.0)) == []  # afresh: looked at from 64 on, nothing of the old round
    assert state.hang.samples == () and state.hang.elsewhere_since is None
    assert state.hang.waiting is None and state.deadlines.hang_at == 68.0  # the quick look
    state, said, ended = _drive(state, view, lambda at: Sample(at, (_hung_process(),)), 68.0, 100.0)  # type: ignore[arg-type]
    assert ended is not None and ended >= 76.0, (ended, names(said))  # the long path (64 + 12)
