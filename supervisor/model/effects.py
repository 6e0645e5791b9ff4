"""What the daemon's decisions ask for, as plain values: records, alerts, the history row,
signals and launches, and the changes to the daemon's state (the ledger, the loop's state,
the deadlines, the exit code).

Every decision returns a tuple of these, in order: a run's end
(:func:`~dflashd.supervisor.model.ending.conclude`), a resumed run
(:func:`~dflashd.supervisor.model.incidents.resumed`), a launch deferred, a stop, the GPU release
check and the GPU samples, recovery at start-up, the live run's deadlines.
:func:`~dflashd.supervisor.model.step.step` folds the changes to the state into the next
:class:`~dflashd.supervisor.model.step.DaemonState` (:data:`Patch`) and hands the rest on, in
order, to the one executor (:class:`~dflashd.supervisor.core.DaemonCore`): :data:`Act`, the only
effects ``step`` returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dflashd.supervisor.model.deadlines import Deadline
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.goodput import Cost, GoodputLedger
from dflashd.supervisor.model.lifecycle import State
from dflashd.supervisor.model.policy import RestartHistory
from dflashd.supervisor.model.verdicts import AlertKind, EndedBy, RoomHold
from dflashd.supervisor.model.world import Share


@dataclass(frozen=True, slots=True)
class Incident:
    """A failure a person was told of, open until a run passes its step (:mod:`incidents`)."""

    kind: str  # the verdict alerted: stalled, crashed, ...
    step: int | None  # the furthest step its runs reached (None: passed by any first step)


@dataclass(frozen=True, slots=True)
class UpdateLedger:
    """How the ledger changes: after a run's end, a resumed run, a torchrun restart, a
    deferred launch, or what start-up carried over from the dead daemon."""

    last_exit: dict[str, Any] | None = None  # None: unchanged
    history: RestartHistory | None = None  # None: unchanged
    counted_verdict: str | None = None  # a relaunch follows: counted under this verdict
    clear_cache_next: bool | None = None
    fatal_reason: str | None = None
    recovering_from: str | None = None  # "stalled"/"fatal": alert when training resumes
    recovered: bool = False  # the recovery was announced: nothing to wait for any more
    incident: Incident | None = None  # None: unchanged
    agent_restarts: int = 0  # torchrun restarted its workers (added)
    agent_worker_failures: int = 0  # ...after a worker failed (added)
    restarts_by_verdict: dict[str, int] | None = None  # carried over from state.json
    goodput: GoodputLedger | None = None  # carried over from runs.sqlite
    diverged_at: int | None = None  # a run's loss diverged at this step (None: unchanged)
    hold: RoomHold | None = None  # the next relaunch waits for it (a rule's; None: unchanged)
    hold_over: bool = False  # ...no longer


@dataclass(frozen=True, slots=True)
class WriteRecord:
    """One ``dflashd`` record; ``log_level``: also dflashd's own log; ``wait_s``: onto disk."""

    event: Event
    fields: dict[str, Any]
    log_level: str | None = None
    wait_s: float | None = None
    run_no: int | None = None  # None: the run the effects are applied for


@dataclass(frozen=True, slots=True)
class SendAlert:
    """One alert; ``fields``: the exit's (code, signal, duration, tail) for the payload."""

    kind: AlertKind
    reason: str
    fields: dict[str, Any]


@dataclass(frozen=True, slots=True)
class RecordHistory:
    """The run's row in runs.sqlite."""

    run_no: int
    ended_at: float
    row: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SettleProcesses:
    """What becomes of the dead run's processes: killed now (dflashd ended it), or noted
    as leftovers and ended before the next launch."""

    kill_now: bool


@dataclass(frozen=True, slots=True)
class EnterState:
    """The loop's next state."""

    state: State


@dataclass(frozen=True, slots=True)
class RestartIn:
    """The next launch, after ``delay_s``."""

    delay_s: float


@dataclass(frozen=True, slots=True)
class SetTimer:
    """Set (or, with ``at`` None, clear) one of the loop's deadlines (monotonic seconds)."""

    deadline: Deadline
    at: float | None


@dataclass(frozen=True, slots=True)
class StopAsked:
    """``dflashd stop`` or SIGTERM: no relaunch from now on; the time from ``at`` is stopped."""

    at: float


@dataclass(frozen=True, slots=True)
class RunLaunched:
    """The run the effects are applied for was launched at ``started_mono`` (or failed to
    spawn): it is the current run from now on (its facts are the state's), and the gap
    before it closes (goodput)."""

    started_mono: float


@dataclass(frozen=True, slots=True)
class KillHolders:
    """SIGKILL to these pids, each proven a process of the dead run (its GPU memory holders)."""

    pids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SignalLeftovers:
    """A signal to every process the dead run left (its custody proves them its own)."""

    signum: int


@dataclass(frozen=True, slots=True)
class WatchEmpty:
    """Watch the dead run's custody on a thread until nothing of it is left (an input then:
    the relaunch follows the last leftover at once, not a poll)."""


@dataclass(frozen=True, slots=True)
class ExitDaemon:
    """The daemon ends with ``code`` (done, stopped, fatal)."""

    code: int


@dataclass(frozen=True, slots=True)
class Launch:
    """Launch the next run (the executor; its result comes back as an input)."""

    clear_cache: bool  # clear the compile caches dflashd owns first (after an early death)
    run_no: int | None  # a deferred launch's number, kept (None: the next one)
    best_before: int | None  # the best step a new run must pass to make new progress
    downtime_s: float | None  # the downtime this launch closes
    visible_gpus: tuple[int, ...] | None = None  # CUDA_VISIBLE_DEVICES (a GPU left out: preflight)


@dataclass(frozen=True, slots=True)
class SayLaunched:
    """Tell who waits for a launch (``start``'s client, systemd's READY=1) that it is on disk:
    the run lives, or its spawn failed (``error``)."""

    error: str | None = None


@dataclass(frozen=True, slots=True)
class PrepareStandby:
    """Start the next run's interpreter now, its imports done (the run trains: host/standby.py)."""


@dataclass(frozen=True, slots=True)
class KeepPaceBaseline:
    """The run's own step time was just learnt: the host as it is now (its CPU waits, its GPUs'
    clocks) is kept to judge a later slowdown's causes by."""


@dataclass(frozen=True, slots=True)
class LookForSlowCauses:
    """The run turned slow against its own step time at ``since`` (``ratio`` times it): ask the
    host why (the answer: :class:`~dflashd.supervisor.model.inputs.SlowCauses`)."""

    since: float
    ratio: float | None


@dataclass(frozen=True, slots=True)
class LookForRelease:
    """Look whether the dead run is gone and its GPU memory released (the executor asks the
    host; the answer comes back as :class:`~dflashd.supervisor.model.inputs.ReleaseLooked`),
    and, for a relaunch a rule holds, how much room the filesystem of ``room_of`` has (empty:
    the job's working directory)."""

    room_of: str | None = None
    past_leftovers: bool = False  # what the dead run left was given up on: not looked for again


@dataclass(frozen=True, slots=True)
class StopRun:
    """``dflashd stop`` for the live run: SIGTERM to its group, SIGKILL past ``timeout_s``
    (folded by ``step`` into the signals and the grace: model/killing.py)."""

    timeout_s: float


@dataclass(frozen=True, slots=True)
class SignalRun:
    """A signal to the live run through its custody: its process group, or its root only."""

    to: str  # "group" or "root"
    signum: int


@dataclass(frozen=True, slots=True)
class KillRun:
    """SIGKILL to every process of the live run (its custody, nothing escapes)."""


@dataclass(frozen=True, slots=True)
class DumpStacks:
    """A py-spy dump of the live run (on a thread; it comes back as an input)."""

    trigger: str
    dump_id: str
    native: bool = False
    before_kill: bool = False  # dflashd ends the run: the kill waits for this dump


@dataclass(frozen=True, slots=True)
class KeepStacks:
    """The dump taken before dflashd ended the run, kept with its facts (its file, the odd
    rank out, the top frames): the run's ``stacks``; the kill waits for no dump any more."""

    stacks: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class EndRun:
    """dflashd ends the live run for ``why`` (a stall, no GPU memory, a diverged loss): a
    stacks dump, then the kill (folded by ``step`` into them: model/killing.py).  Dropped
    where dflashd already ends it."""

    why: EndedBy


@dataclass(frozen=True, slots=True)
class SampleStacks:
    """A hang sample of the live run; ``share``: this node's finding shared through the job's
    store, and the others' heard."""

    share: Share | None = None


@dataclass(frozen=True, slots=True)
class EndRunHung:
    """The live run is proven hung: end it now (the sample that proved it is its dump)."""

    why: str
    frames: tuple[str, ...]
    hung_after_s: float


@dataclass(frozen=True, slots=True)
class Publish:
    """Write the status now (state.json, metrics, systemd's STATUS=, the goodput totals):
    ``shown``, as a client's ``status`` showed it (no total shown ever goes back); ``final``,
    the daemon's last write."""

    shown: bool = False
    final: bool = False


@dataclass(frozen=True, slots=True)
class NotifySystemd:
    """One sd_notify message (``STOPPING=1``, ``WATCHDOG=1``)."""

    text: str


@dataclass(frozen=True, slots=True)
class SettleGoodput:
    """The run's cost into the goodput ledger; the gap after ``died_mono`` is downtime when
    a relaunch follows, stopped time when none does."""

    cost: Cost
    died_mono: float
    relaunch: bool


# What only the state sees: folded into the next DaemonState by ``step`` (``StopRun`` and
# ``EndRun`` into the acts they mean, too), never handed to the executor.
Patch = (
    UpdateLedger
    | SettleGoodput
    | EnterState
    | RestartIn
    | SetTimer
    | StopAsked
    | ExitDaemon
    | KeepStacks
    | StopRun
    | EndRun
)

# What the executor carries out, in one ``match`` (``core.py``); ``step`` returns only these.
Act = (
    WriteRecord
    | SendAlert
    | RecordHistory
    | SettleProcesses
    | RunLaunched
    | KillHolders
    | SignalLeftovers
    | WatchEmpty
    | Launch
    | SayLaunched
    | LookForRelease
    | PrepareStandby
    | KeepPaceBaseline
    | LookForSlowCauses
    | SignalRun
    | KillRun
    | DumpStacks
    | SampleStacks
    | EndRunHung
    | Publish
    | NotifySystemd
)

# What a decision returns, in order, before ``step`` folds it: patches and acts.
Effect = Patch | Act
