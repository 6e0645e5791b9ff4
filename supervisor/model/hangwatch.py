"""A live run's hang watch, a value: what the deciders' actions make of it (pure).

:func:`~dflashd.supervisor.model.hang.decide` (a run past its first step) and
:func:`~dflashd.supervisor.model.startup.startup_decide` (a run before it) say what to do
about a suspect run: wait, take a sample, start a new round, name a stuck start-up or end
it as hung.  The arms here carry that out on the run's :class:`HangWatch`: the next watch
(never changed in place) and the effects, in order: the next look (a ``SetTimer``, only when
it moves), a sample to take, the ``hang_suspect`` and ``hang_check`` records, the one
``waiting`` alert.  Ending a hung run is the live run's control's (it owns the kill).
No clock, no I/O: ``now`` and the wall time come in.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any

from dflashd.supervisor.model.deadlines import Deadline
from dflashd.supervisor.model.effects import (
    Effect,
    EndRunHung,
    Publish,
    SampleStacks,
    SendAlert,
    SetTimer,
    WriteRecord,
)
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.hang import (
    EndHung,
    HangAction,
    HangWatch,
    NewRound,
    QuickOver,
    TakeSample,
    Wait,
)
from dflashd.supervisor.model.hang import decide as decide_hang
from dflashd.supervisor.model.inputs import HangLook
from dflashd.supervisor.model.judge import Finding, Judgement, Sample
from dflashd.supervisor.model.stacks import StacksDump
from dflashd.supervisor.model.startup import StartupAction, StartupStuck, startup_decide
from dflashd.supervisor.model.verdicts import Notice
from dflashd.supervisor.model.world import Share, world_summary

Arm = tuple[HangWatch, tuple[Effect, ...]]


def next_look(hang_at: float | None, at: float | None) -> tuple[Effect, ...]:
    """The next look at ``at`` in the deadline table: a wake-up, set only when it moves."""
    return () if hang_at == at else (SetTimer(Deadline.HANG, at),)


def sampled(watch: HangWatch, sample: Sample, dump: StacksDump) -> HangWatch:
    """A sample came back: one more of the round's, its dump the latest."""
    return replace(watch, sampling=False, samples=(*watch.samples, sample), last_dump=dump)


def after_progress(watch: HangWatch, last_progress: float | None) -> HangWatch:
    """A run past its first step, before the decider looks: a start-up's named wait is over,
    a start-up's round gives way to the hang rounds, and a round older than the last step
    is stale."""
    if watch.waiting is not None and watch.waiting.get("kind") == "startup":
        watch = replace(watch, waiting=None)  # it made its first step after all
    if not watch.rounds:
        watch = replace(watch, next_round_at=None)
    if watch.samples and (last_progress or 0.0) >= watch.samples[0].at:
        watch = replace(
            watch,
            samples=(),
            next_round_at=None,
            gpu_wait=None,
            elsewhere_last=None,
            quick=False,
        )
    elif watch.quick and not watch.samples and not watch.sampling:
        watch = replace(watch, quick=False)  # a quick look that a step ended before it began
    last = watch.elsewhere_last
    if last is not None and last_progress is not None and last_progress > last[2]:
        watch = wait_over(watch)  # a step after the last round that found the wait: it ended
    return watch


def afresh(watch: HangWatch, worker_rounds: int) -> HangWatch:
    """The launcher restarted the workers (torchrun re-formed the group): what the rounds
    found of the old workers is not evidence about the new ones; the judgment starts again
    (a real hang of the new group is still found, from its own rounds)."""
    return replace(
        HangWatch(rounds=watch.rounds, sampling=watch.sampling, last_dump=watch.last_dump),
        waiting=wait_over(watch).waiting,
        worker_rounds=worker_rounds,
        # kept for the end's reason: a group that failed because a peer was lost says so
        elsewhere_last=watch.elsewhere_last,
    )


def wait_over(watch: HangWatch) -> HangWatch:
    """A wait elsewhere that ended (a step came after its last round): over.
    A later wait is a new one, timed from its own start (two short waits on a sibling's lock
    are not one long wait), and a later crash is the job's own, never a lost peer's."""
    waiting = watch.waiting if (watch.waiting or {}).get("kind") != "elsewhere" else None
    return replace(
        watch, elsewhere_since=None, elsewhere_alerted=False, elsewhere_last=None, waiting=waiting
    )


def hang_arm(
    watch: HangWatch,
    action: HangAction,
    now: float,
    wall: float,
    hang_at: float | None,
    *,
    share: Share | None = None,
    suspect: dict[str, Any] | None = None,
    quick_for: float | None = None,
) -> Arm:
    """What :func:`~dflashd.supervisor.model.hang.decide`'s ``action`` makes of the watch.

    ``share``: what this node tells the others at a round's first sample; ``suspect``: the
    ``hang_suspect`` record's fields then (the caller's, from the run's progress);
    ``quick_for``: the last step whose silence a quick look is about.  An
    :class:`EndHung` keeps the judgement; the kill is the caller's."""
    match action:
        case Wait(until=until):
            return watch, next_look(hang_at, until)
        case TakeSample(quick=True):
            # a quick look: no record (a pause of a few seconds is common); its end says it
            # (the other nodes are not asked: a wait on them is a sign of work for the quick look)
            watch = replace(watch, quick=True, quick_for=quick_for, sampling=True)
            return watch, (*next_look(hang_at, None), SampleStacks(None))
        case QuickOver(at=at):
            watch = replace(watch, samples=(), quick=False)
            return watch, next_look(hang_at, at)
        case TakeSample():
            effects: list[Effect] = list(next_look(hang_at, None))
            taken = None
            if not watch.samples:
                watch = replace(watch, rounds=watch.rounds + 1)
                taken = share
                fields = {**(suspect or {}), "round": watch.rounds}
                effects.append(WriteRecord(Event.HANG_SUSPECT, fields, log_level="warning"))
            effects.append(SampleStacks(taken))
            return replace(watch, sampling=True), tuple(effects)
        case NewRound(judgement=judgement, at=at, alert=alert):
            return _new_round(watch, judgement, at, alert, now, wall, hang_at)
        case EndHung(judgement=judgement):
            return replace(watch, last_finding=judgement.why), next_look(hang_at, None)


def _new_round(
    watch: HangWatch,
    judgement: Judgement,
    at: float,
    alert: bool,
    now: float,
    wall: float,
    hang_at: float | None,
) -> Arm:
    heard = next((s.world for s in reversed(watch.samples) if s.world), None)
    world = world_summary(heard)
    gpu_wait = watch.gpu_wait
    if judgement.key is None:
        gpu_wait = None
    elif gpu_wait is None or gpu_wait[0] != judgement.key:
        gpu_wait = (judgement.key, now)  # the same GPU wait, from here
    watch = replace(
        watch,
        samples=(),
        last_kind=judgement.finding,
        next_round_at=at,
        gpu_wait=gpu_wait,
        quick=False,
    )
    effects: list[Effect] = list(next_look(hang_at, at))
    watch, waiting = _waiting_elsewhere(watch, judgement, alert, now, wall)
    effects += waiting
    if (judgement.why, world) != (watch.last_finding, watch.last_world):
        watch = replace(watch, last_finding=judgement.why, last_world=world)
        fields: dict[str, Any] = {"finding": judgement.finding.value}
        fields |= {"why": judgement.why, "next_in_s": round(at - now, 3)}
        if world is not None:
            fields["world"] = world
        effects.append(WriteRecord(Event.HANG_CHECK, fields))
    return watch, tuple(effects)


def _waiting_elsewhere(
    watch: HangWatch, judgement: Judgement, alert: bool, now: float, wall: float
) -> Arm:
    """A round found the run waiting on work outside it (a remote rank, another job's lock):
    never ended for that; after ``remote_wait_s`` one alert names the wait, and the stall
    window stays the last word if nothing ever moves."""
    if judgement.finding is not Finding.ELSEWHERE:
        # the run waits on nothing now: a later wait is timed from its own start.  The last
        # wait is kept for the end's reason until a step: a rank whose peer was lost looks
        # busy (its collective failing, a traceback) in the round before it dies
        return replace(watch, elsewhere_since=None, elsewhere_alerted=False, waiting=None), ()
    since = watch.elsewhere_since if watch.elsewhere_since is not None else now
    waiting = {"kind": "elsewhere", "on": judgement.why, "since": wall - (now - since)}
    waiting["frames"] = list(judgement.frames)
    watch = replace(
        watch,
        elsewhere_since=since,
        elsewhere_last=(judgement.why, since, now),
        waiting=waiting,
    )
    if not alert:
        return watch, ()
    fields: dict[str, Any] = {"waiting": judgement.why, "frames": list(judgement.frames)}
    fields["for_s"] = round(now - since, 3)
    alerted = SendAlert(Notice.WAITING, judgement.why, fields)
    return replace(watch, elsewhere_alerted=True), (alerted,)


def startup_arm(
    watch: HangWatch, action: StartupAction, hang_at: float | None
) -> tuple[HangWatch, tuple[Effect, ...], StartupStuck | None]:
    """What :func:`~dflashd.supervisor.model.startup.startup_decide`'s ``action`` makes of
    the watch; a :class:`StartupStuck` is handed back to be named (:func:`startup_named`)."""
    match action:
        case Wait(until=until):
            return watch, next_look(hang_at, until), None
        case TakeSample():
            return replace(watch, sampling=True), (*next_look(hang_at, None), SampleStacks()), None
        case NewRound(at=at):
            return replace(watch, samples=(), next_round_at=at), next_look(hang_at, at), None
        case StartupStuck():
            return replace(watch, samples=()), next_look(hang_at, None), action
    return watch, (), None


def startup_named(
    watch: HangWatch, judgement: Judgement, held: list[dict[str, Any]], wall: float
) -> Arm:
    """A start-up stuck in a known wait (or beside a stale build lock ``held``, each with its
    path and age): named once, in status (``waiting``), a ``hang_check`` record and the one
    ``waiting`` alert; nothing is ended for it."""
    why = f"the start-up waits, unmoved: {'; '.join(judgement.frames) or judgement.why}"
    fields: dict[str, Any] = {"kind": "startup", "on": why, "since": wall}
    fields["frames"] = list(judgement.frames)
    if held:
        fields["stale_build_locks"] = held
        fields["hint"] = (
            "a killed build left this lock and torch waits on it for ever: remove it if no "
            "build runs (dflashd never deletes it, and will not relaunch into it)"
        )
    check = WriteRecord(
        Event.HANG_CHECK, {"finding": "startup_wait", **fields}, log_level="warning"
    )
    return replace(watch, waiting=fields), (check, SendAlert(Notice.WAITING, why, fields))


def looked(
    watch: HangWatch, look: HangLook, now: float, hang_at: float | None
) -> tuple[HangWatch, tuple[Effect, ...]]:
    """The live run looked at (``step``'s arm): a sample that came back joins its round, then
    the start-up decider (no first step yet) or the hang decider says what to do, and the arms
    of :mod:`hangwatch` carry it out.  A proven hang ends in :class:`EndRunHung` for the
    executor."""
    if look.sample is not None:
        watch = sampled(watch, *look.sample)
    start = look.startup
    if start is not None:  # no first step yet
        available = start.stacks_available and watch.waiting is None
        starting = startup_decide(
            start.started_mono,
            available,
            watch.sampling,
            watch.evidence(),
            now,
            stale_lock=start.stale_lock,
        )
        watch, effects, stuck = startup_arm(watch, starting, hang_at)
        if stuck is None:
            return watch, effects
        held = [{"path": path, "age_s": age} for path, age in start.held]
        watch, named = startup_named(watch, stuck.judgement, held, look.wall)
        return watch, (*effects, *named, Publish())
    if look.view is None:
        return watch, ()
    view = look.view
    if view.worker_rounds != watch.worker_rounds:
        watch = afresh(watch, view.worker_rounds)
    watch = after_progress(watch, view.last_progress)  # a step's, never the restart's
    if view.restarted_at is not None and (view.last_progress or 0.0) < view.restarted_at:
        view = replace(view, last_progress=view.restarted_at)  # suspect from the restart on
    view = replace(view, sampling=watch.sampling)
    action = decide_hang(view, watch.evidence(), now, look.limits)
    suspect = None
    if isinstance(action, TakeSample) and not watch.samples and not action.quick:  # say why
        typical = statistics.median(view.intervals) if view.intervals else None
        suspect = {
            "no_step_for_s": round(now - (view.last_progress or now), 3),
            "step": look.step,
            "typical_interval_s": None if typical is None else round(typical, 3),
        }
    watch, effects = hang_arm(
        watch,
        action,
        now,
        look.wall,
        hang_at,
        share=look.share,
        suspect=suspect,
        quick_for=view.last_progress,
    )
    if isinstance(action, EndHung):
        judged = action.judgement
        effects = (*effects, EndRunHung(judged.why, judged.frames, action.hung_after_s))
    return watch, effects
