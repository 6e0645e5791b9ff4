"""The daemon as one reducer: ``step(state, input, now) -> (state, effects)``.

:class:`DaemonState` is the whole of the daemon's state that outlives a wake-up: the loop's
state, the deadline table, the ledger, and the rules it decides by.  It is a value: ``step``
returns the next one, and nothing assigns to it.  The effects ``step`` returns are what must
happen outside the model (records, alerts, signals, a launch, a status write), in order; the
one executor (:class:`~dflashd.supervisor.core.DaemonCore`) carries them out and hands any
answer back as the next input.  No clock, no I/O: ``now`` and the jitter come in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Final

from dflashd.supervisor.model.carried import opened, restore
from dflashd.supervisor.model.deadlines import RUN_DEADLINES, Deadline, Deadlines
from dflashd.supervisor.model.died import died_facts
from dflashd.supervisor.model.effects import (
    Act,
    DumpStacks,
    Effect,
    EndRun,
    EndRunHung,
    EnterState,
    ExitDaemon,
    KeepStacks,
    KillRun,
    Launch,
    LookForRelease,
    NotifySystemd,
    Publish,
    RestartIn,
    RunLaunched,
    SayLaunched,
    SendAlert,
    SetTimer,
    SettleGoodput,
    StopAsked,
    StopRun,
    UpdateLedger,
    WriteRecord,
)
from dflashd.supervisor.model.ending import conclude
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.gpurelease import ReleaseWait, release_step
from dflashd.supervisor.model.hang import HangWatch
from dflashd.supervisor.model.hangwatch import looked
from dflashd.supervisor.model.inputs import (
    CarriedOver,
    ChildExited,
    DeadlineDue,
    DumpRead,
    Emptied,
    GpuSeen,
    HangDumpWritten,
    HangLook,
    Input,
    Launched,
    LaunchPutOff,
    LinesSeen,
    NotifyRead,
    Reaped,
    ReleaseLooked,
    SlowCauses,
    SlowStacks,
    StacksAsked,
    StallLook,
    Started,
    StatusChanged,
    StatusWritten,
    StopRequested,
)
from dflashd.supervisor.model.killing import (
    after_dump,
    dump_then_kill,
    hung_kill,
    stop_grace_over,
    stop_signals,
)
from dflashd.supervisor.model.ledger import Ledger
from dflashd.supervisor.model.leftovers import leftovers_step
from dflashd.supervisor.model.lifecycle import LoopState, State
from dflashd.supervisor.model.policy import RestartConfig
from dflashd.supervisor.model.preflight import GpuHealth, preflight
from dflashd.supervisor.model.reading import Against, read, reaped, workers_run
from dflashd.supervisor.model.relaunch import relaunch_effects
from dflashd.supervisor.model.rules import ALERTED_BY_DEFAULT
from dflashd.supervisor.model.runstate import RunState, stall_decide
from dflashd.supervisor.model.verdicts import AlertKind, EndedBy

LAUNCH_RETRY_S: Final = 1.0  # a launch deferred for want of descriptors is tried again after this
HOLD_LOOK_S: Final = 5.0  # a relaunch a rule holds (room on a full disk) looks again after this


@dataclass(frozen=True, slots=True)
class Rules:
    """What the daemon decides by (from the config; constant for its life)."""

    policy: RestartConfig = field(default_factory=RestartConfig)
    alerts_on: tuple[AlertKind, ...] = ALERTED_BY_DEFAULT
    watchdog_every_s: float | None = None  # systemd's WatchdogSec, halved (None: no watchdog)
    vram_grace_s: float = 300.0  # a run with no first step holding no GPU memory past it ends
    gpus_allowed: tuple[int, ...] | None = None  # the config's ``gpus`` list (None: all)
    gpu_fallback: bool = False  # relaunch on the other GPUs when one is unusable
    no_dumps: str | None = None  # why py-spy cannot dump the run (None: it can)
    gpu_release_s: tuple[float, float] = (60.0, 2.0)  # the GPU release's timeout, poll interval
    on_diverge: str = "alert"  # a diverged loss: "alert", or "stop" (the run ends, no relaunch)


@dataclass(frozen=True, slots=True)
class DaemonState:
    """The daemon's state: replaced by :func:`step`, never changed."""

    rules: Rules = field(default_factory=Rules)
    loop: LoopState = field(default_factory=LoopState)
    deadlines: Deadlines = field(default_factory=Deadlines)
    ledger: Ledger = field(default_factory=Ledger)
    deferred_run_no: int | None = None  # a deferred launch keeps its number
    hang: HangWatch = field(default_factory=HangWatch)  # the current run's hang evidence
    run: RunState | None = None  # the current (or last) run's facts
    dumps_asked: int = 0  # stack dumps asked for so far: the next one's id is its run's and this
    last_dump_id: str | None = None  # the id given to the last dump asked for
    leftovers_since: float | None = None  # the dead run's leftovers were first found then
    gpu_release: ReleaseWait = field(default_factory=ReleaseWait)  # for the dead run's GPUs
    hung_end: EndRunHung | None = None  # a proven hang whose kill waits for its dump's files


Step = tuple[DaemonState, tuple[Act, ...]]


def fold(state: DaemonState, effects: Iterable[Effect], now: float) -> Step:
    """Fold the effects that change the state into it; return it and the rest, in order."""
    loop, deadlines, ledger, run = state.loop, state.deadlines, state.ledger, state.run
    out: list[Act] = []
    pending = deque(effects)  # an end dflashd decides is folded into the effects it means
    while pending:
        effect = pending.popleft()
        match effect:
            case SendAlert(kind):
                run = run.alerted_of(kind) if run is not None else None
                out.append(effect)
            case StopRun(timeout_s):
                if run is not None and not run.ended_by_us:
                    run = run.ending(EndedBy.STOP)
                pending.extendleft(reversed(stop_signals(timeout_s, now)))
            case EndRun(why):
                if run is None or run.ended_by_us:
                    continue  # dflashd ends it already: one end, its first reason
                run = run.ending(why)
                no_dumps = state.rules.no_dumps
                ending = dump_then_kill(why.value, Event.ENDING_RUN, no_dumps, now)
                pending.extendleft(reversed(ending))
            case EndRunHung(hung_after_s=hung_after_s):
                run = run.ending(EndedBy.HUNG, hung_after_s=hung_after_s) if run else None
                state = replace(state, hung_end=effect)
                out.append(effect)  # the proving sample's files written; the kill follows
            case DumpStacks(dump_id=dump_id, before_kill=before_kill):
                if not dump_id:  # named here: the run's number and the count of dumps asked
                    asked = state.dumps_asked + 1
                    dump_id = f"{run.run_no if run is not None else 0}-{asked}"
                    state = replace(state, dumps_asked=asked)
                    effect = replace(effect, dump_id=dump_id)
                state = replace(state, last_dump_id=dump_id)
                if before_kill and run is not None:
                    run = replace(run, dump_before_kill=dump_id)
                out.append(effect)
            case KeepStacks(stacks):
                run = replace(run, stacks=stacks, dump_before_kill=None) if run else None
            case UpdateLedger():
                ledger = ledger.took(effect)
            case SettleGoodput(cost, died_mono, relaunch):
                goodput = ledger.goodput.ended(cost, died_mono, relaunch=relaunch)
                ledger = replace(ledger, goodput=goodput)
            case RunLaunched(started_mono):
                ledger = replace(ledger, goodput=ledger.goodput.launched(started_mono))
                state = replace(state, hang=HangWatch(), hung_end=None)  # a new run: no evidence
                out.append(effect)  # the shell's current run from now on
            case StopAsked(at):
                loop = replace(loop, stop_requested=True)
                ledger = replace(ledger, goodput=ledger.goodput.stopping(at))
                deadlines = deadlines.set(Deadline.RESTART, None)
                deadlines = deadlines.set(Deadline.RELEASE_CHECK, None)
            case EnterState(target):
                loop = loop.entered(target)
            case RestartIn(delay_s):
                deadlines = deadlines.set(Deadline.RESTART, now + delay_s)
            case SetTimer(deadline, at):
                deadlines = deadlines.set(deadline, at)
            case ExitDaemon(code):
                loop = loop.ended_with(code)
                deadlines = deadlines.set(Deadline.STOP, None)
            case _:
                out.append(effect)
    return replace(state, loop=loop, deadlines=deadlines, ledger=ledger, run=run), tuple(out)


def launch_effects(state: DaemonState, now: float) -> tuple[Effect, ...]:
    """The next run: starting, the cache clearing taken for it, the launch."""
    ledger = state.ledger
    goodput = ledger.goodput
    return (
        EnterState(State.STARTING),
        UpdateLedger(clear_cache_next=False),
        Launch(
            clear_cache=ledger.clear_cache_next,
            run_no=state.deferred_run_no,
            best_before=goodput.best_before(ledger.history.best_step),
            downtime_s=goodput.downtime_s(now),
        ),
    )


def checked_launch(
    state: DaemonState, health: tuple[GpuHealth, ...], ecc: dict[int, int], now: float
) -> tuple[Effect, ...]:
    """A relaunch after the pre-flight of the GPUs the dead run held (model/preflight.py);
    none read (no NVML): as before."""
    if not health:
        return launch_effects(state, now)
    rules, xids = state.rules, state.run.gpu_xids if state.run is not None else ()
    allowed, fallback = rules.gpus_allowed, rules.gpu_fallback
    checked = preflight(health, ecc, {-1: xids}, allowed=allowed, fallback=fallback)
    return relaunch_effects(checked, health, launch_effects(state, now))


def deferred_launch(
    run_no: int, error: str, *, freed: int, clear_cache: bool, now: float
) -> tuple[Effect, ...]:
    """A launch deferred for want of a resource the host gives back: said, the cache
    clearing kept for the next attempt, tried again after :data:`LAUNCH_RETRY_S`."""
    fields = {"error": error, "retry_in_s": LAUNCH_RETRY_S, "reserve_freed": freed}
    return (
        WriteRecord(Event.LAUNCH_DEFERRED, fields, log_level="warning", run_no=run_no),
        UpdateLedger(clear_cache_next=clear_cache),
        SetTimer(Deadline.RESTART, now + LAUNCH_RETRY_S),
    )


def stop_effects(*, alive: bool, now: float) -> tuple[Effect, ...]:
    """``dflashd stop``: no relaunch from now on; stopping while a run lives, else stopped."""
    stopping = (StopAsked(now), EnterState(State.STOPPING))
    return stopping if alive else (*stopping, EnterState(State.STOPPED))


def decide(state: DaemonState, heard: Input, now: float) -> tuple[DaemonState, tuple[Effect, ...]]:
    """What ``heard`` asks for, before folding: (the state's non-effect changes, effects)."""
    match heard:
        case Started():
            return state, (*opened(heard, now), *launch_effects(state, now))
        case Launched(facts):  # its facts are the current run's from now on
            launched = (RunLaunched(facts.started_mono), EnterState(State.RUNNING), Publish())
            state = replace(state, run=facts, gpu_release=ReleaseWait())  # strangers said anew
            return state, (*launched, SayLaunched())
        case LaunchPutOff(run_no, error, freed, clear):
            effects = deferred_launch(run_no, error, freed=freed, clear_cache=clear, now=now)
            return replace(state, deferred_run_no=run_no), effects
        case ChildExited(facts, jitter, launched, publish):
            ledger = state.ledger
            stopping, stop_at = state.loop.stop_requested, ledger.goodput.stop_at
            facts = replace(facts, stop_requested=stopping, stop_at=stop_at)
            outcome = conclude(
                facts,
                history=ledger.history,
                policy=state.rules.policy,
                alerts_on=state.rules.alerts_on,
                jitter=jitter,
                incident=ledger.incident,
            )
            cleared = tuple(SetTimer(d, None) for d in RUN_DEADLINES)
            first = () if launched is None else (RunLaunched(launched.started_mono),)
            tail = (Publish(),) if publish else ()
            if launched is not None:  # the spawn failed: said once its records are written
                tail = (*tail, SayLaunched(facts.obs.spawn_error or "spawn failed"))
            current = state if launched is None else replace(state, run=launched)
            return current, (*first, *cleared, *outcome.effects, *tail)
        case StopRequested(timeout_s, alive):
            if state.loop.stop_requested or state.loop.done:
                return state, ()
            effects = stop_effects(alive=alive, now=now)
            live = (StopRun(timeout_s),) if alive else ()
            return state, (*effects, NotifySystemd("STOPPING=1"), *live, Publish())
        case DeadlineDue(deadline):
            return state, _due(state, deadline, now)
        case ReleaseLooked(leftovers, gpus, health, ecc, room):
            if leftovers is not None:  # nothing of the dead run lives into the next
                since, ending, go_on = leftovers_step(state.leftovers_since, leftovers, now)
                state = replace(state, leftovers_since=since)
                return state, (*ending, *((look_for_release(state, past=True),) if go_on else ()))
            limits = state.rules.gpu_release_s  # its GPU memory: the wait, its timeout
            wait, effects, ready = release_step(state.gpu_release, gpus, now, *limits)
            state = replace(state, leftovers_since=None, gpu_release=wait)
            if not ready:
                return state, effects
            hold = state.ledger.hold
            if hold is not None and room is not None and not hold.ready(*room):
                # no relaunch into a disk that is still full: looked at again
                return state, (*effects, SetTimer(Deadline.RELEASE_CHECK, now + HOLD_LOOK_S))
            over: tuple[Effect, ...] = ()
            if hold is not None:  # room again (or the path can no longer be read: not held)
                free, size = room if room is not None else (None, None)
                fields = {"waited_for": hold.describe(), "free_bytes": free, "size_bytes": size}
                over = (WriteRecord(Event.HOLD_OVER, fields), UpdateLedger(hold_over=True))
            return state, (*effects, *over, *checked_launch(state, health, ecc, now))
        case Emptied(run_no, current, alive):
            waiting = state.deadlines.release_check_at is not None
            if waiting and current == run_no and not alive:
                return state, (SetTimer(Deadline.RELEASE_CHECK, None), look_for_release(state))
            return state, ()
        case CarriedOver():
            return state, restore(heard, now).effects
        case Reaped(run_no, jitter=jitter) if state.run is not None and state.run.run_no == run_no:
            last, curve = reaped(state.run, against(state))  # the curve ends where the run did
            died = ChildExited(died_facts(last, state.hang, heard), jitter)
            state, effects = decide(replace(state, run=last), died, now)
            return state, (*curve, *effects)
        case Reaped():  # of no current run: nothing to conclude
            return state, ()
        case LinesSeen() | NotifyRead() | GpuSeen() | SlowCauses() | SlowStacks():
            found = read(state.run, heard, against(state), now)
            if found is None:  # of no current run: what was read is still said, nothing more
                if isinstance(heard, GpuSeen):
                    return state, heard.records
                return state, (heard.said,) if isinstance(heard, SlowStacks) else ()
            return replace(state, run=found[0]), found[1]
        case StallLook(run_no, runnable, cpu_used_s, workers):
            run = state.run
            if run is None or run.run_no != run_no or run.ended_by_us:
                return state, ()
            if workers:  # a torchrun agent whose workers run: past its rendezvous, not stalled
                run, said = workers_run(run, against(state))
                return replace(state, run=run), said
            run, why = stall_decide(run, runnable=runnable, cpu_used_s=cpu_used_s, now=now)
            return replace(state, run=run), (() if why is None else (EndRun(why),))
        case DumpRead(run_no, dump_id, said, kept, ok, trigger, error, alive):
            run = state.run
            awaited = run is not None and run.run_no == run_no and run.dump_before_kill == dump_id
            flags = {"awaited": awaited, "alive": alive, "ok": ok}
            return state, after_dump(said, kept, **flags, trigger=trigger, error=error, now=now)
        case StacksAsked(native):  # named in the fold (the reply says its id)
            return state, (DumpStacks("command", "", native=native),)
        case HangDumpWritten(run_no, said, kept, alive):
            hung, run = state.hung_end, state.run
            if hung is None or run is None or run.run_no != run_no:
                return state, ()
            return replace(state, hung_end=None), (hung_kill(hung, said, kept) if alive else ())
        case StatusChanged():
            return replace(state, deadlines=state.deadlines.changed()), ()
        case StatusWritten():
            return replace(state, deadlines=state.deadlines.published(now)), ()
        case HangLook():
            watch, effects = looked(state.hang, heard, now, state.deadlines.hang_at)
            return replace(state, hang=watch), effects


def _due(state: DaemonState, deadline: Deadline, now: float) -> tuple[Effect, ...]:
    match deadline:
        case Deadline.WATCHDOG:
            every = state.rules.watchdog_every_s or 1.0
            return (NotifySystemd("WATCHDOG=1"), SetTimer(Deadline.WATCHDOG, now + every))
        case Deadline.RESTART | Deadline.RELEASE_CHECK:
            return (look_for_release(state),)
        case Deadline.STOP:  # the grace is over, and the run lives (its end clears it)
            waiting = state.run.dump_before_kill if state.run is not None else None
            return stop_grace_over(waiting, state.rules.no_dumps, now)
        case Deadline.KILL:  # the dump the kill waited for is past its bound (the run lives)
            return (KillRun(),)
        case _:  # the live run's hang look: its control reads the table
            return ()


def look_for_release(state: DaemonState, *, past: bool = False) -> LookForRelease:
    """The look before a relaunch; for one a rule holds, the room where it waits, too
    (``past``: the dead run's leftovers were given up on)."""
    hold = state.ledger.hold
    return LookForRelease(room_of=None if hold is None else hold.path, past_leftovers=past)


def against(state: DaemonState) -> Against:
    """What a reading of the live run is judged against (model/reading.py)."""
    rules = state.rules
    return Against(state.ledger, rules.alerts_on, rules.on_diverge, rules.vram_grace_s)


def step(state: DaemonState, heard: Input, now: float) -> Step:
    """The daemon's one reducer: the next state and what must happen outside, in order."""
    if isinstance(heard, DeadlineDue):
        state = replace(state, deadlines=state.deadlines.set(heard.deadline, None))
    state, effects = decide(state, heard, now)
    if isinstance(heard, Started | ReleaseLooked) and any(isinstance(e, Launch) for e in effects):
        # the launch takes the kept number, and no restart timer outlives it
        restart = state.deadlines.set(Deadline.RESTART, None)
        state = replace(state, deferred_run_no=None, deadlines=restart)
    return fold(state, effects, now)
