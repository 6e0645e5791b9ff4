"""What the loop hears, as values: each is handed to :func:`~dflashd.supervisor.model.step.step`.

The shell turns what woke it (a signal, a datagram, a deadline, a thread's message, the
answer to an effect it carried out) into one of these; the model decides what follows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dflashd.supervisor.model.agent import AgentLine
from dflashd.supervisor.model.deadlines import Deadline
from dflashd.supervisor.model.effects import WriteRecord
from dflashd.supervisor.model.goodput import LoggedRun
from dflashd.supervisor.model.gpurelease import GpuHolders
from dflashd.supervisor.model.gpuuse import ChildGpuUse
from dflashd.supervisor.model.hang import HangLimits, HangView
from dflashd.supervisor.model.judge import Sample
from dflashd.supervisor.model.leftovers import Leftovers
from dflashd.supervisor.model.preflight import GpuHealth
from dflashd.supervisor.model.progress import LineProgress, NotifyMessage
from dflashd.supervisor.model.runstate import RunFacts, RunState
from dflashd.supervisor.model.stacks import StacksDump
from dflashd.supervisor.model.world import Share


@dataclass(frozen=True, slots=True)
class CarriedOver:
    """Start-up, before the first launch: what the last daemon left, as the shell read it
    (state.json, runs.sqlite's goodput row, the run log's unsaved tail), the records of what
    of its run the host ended (proven ours), and the facts of a run it never saw end."""

    previous: Mapping[str, Any]
    saved_goodput: tuple[float, Any, bool] | None
    leftovers: tuple[WriteRecord, ...] = ()
    torn_bytes: int = 0
    last_run: int = 0
    now_wall: float = 0.0
    logged: LoggedRun | None = None
    lost: RunFacts | None = None


@dataclass(frozen=True, slots=True)
class Started:
    """The daemon is open: the first launch; ``gpu_checks_off``: why the GPU checks are off
    (None: on), ``watchdog``: systemd's watchdog is to be fed."""

    gpu_checks_off: str | None = None
    watchdog: bool = False


@dataclass(frozen=True, slots=True)
class ChildExited:
    """The run's root was reaped (or failed to spawn): its facts, gathered by the shell."""

    facts: RunFacts
    jitter: float  # the backoff's jitter, in [0, 1)
    launched: RunState | None = None  # the launch itself failed: this run is current from now on
    publish: bool = True  # False: a run lost with a dead daemon, concluded before the first launch


@dataclass(frozen=True, slots=True)
class Launched:
    """A launch succeeded: the run's root lives; ``facts``, what is known of it."""

    facts: RunState


@dataclass(frozen=True, slots=True)
class LaunchPutOff:
    """A launch was deferred for want of a resource the host gives back (descriptors)."""

    run_no: int
    error: str
    freed: int  # descriptors the reserve gave back for the records and the next attempt
    clear_cache: bool  # the cache clearing asked for this launch, kept for the next


@dataclass(frozen=True, slots=True)
class StopRequested:
    """``dflashd stop``, SIGTERM, SIGINT; ``alive``: a run lives to be stopped."""

    timeout_s: float
    alive: bool


@dataclass(frozen=True, slots=True)
class DeadlineDue:
    """One deadline of the table came (it is cleared as it is handed in)."""

    deadline: Deadline


@dataclass(frozen=True, slots=True)
class ReleaseLooked:
    """The answer to :class:`~dflashd.supervisor.model.effects.LookForRelease`: ``leftovers``,
    what the dead run still has running (model/leftovers.py decides); else who holds GPU memory
    (``gpus``; None: the GPU checks are off; model/gpurelease.py decides)."""

    leftovers: Leftovers | None = None
    gpus: GpuHolders | None = None
    # the GPUs the dead run held, read for the pre-flight (model/preflight.py), and their
    # uncorrectable ECC counts when it launched
    health: tuple[GpuHealth, ...] = ()
    ecc_at_launch: dict[int, int] = field(default_factory=dict)
    room: tuple[int, int] | None = None  # asked for: (free, size) bytes (None: unreadable)


@dataclass(frozen=True, slots=True)
class Emptied:
    """The dead run's last process is gone (a custody watcher saw it)."""

    run_no: int
    current_run_no: int | None  # the current run's number, None: none
    current_alive: bool


@dataclass(frozen=True, slots=True)
class LinesSeen:
    """From a drain thread to the loop: the live run printed lines (a step among them, or
    liveness), its torchrun agent's lines among them; ``tail``: its last lines, read by the
    loop where a loss came with them (the alert of a divergence carries them)."""

    run_no: int
    progress: LineProgress | None
    last_line: str | None
    agent: tuple[AgentLine, ...] = ()  # torchrun agent lines (watch/elastic.py), in order
    tail: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NotifyRead:
    """An sd_notify datagram of the live run (its sender proven the run's by the shell);
    ``worker``: sent by a process other than the run's root (a torchrun agent's worker)."""

    run_no: int
    message: NotifyMessage
    worker: bool = False


@dataclass(frozen=True, slots=True)
class GpuSeen:
    """A GPU sample, joined with the live run (``run_no`` None: no run lives, its records
    only): the sample's records, the GPUs as it saw them (for the snapshot the no-GPU-memory
    verdict writes), and what it says of the run."""

    run_no: int | None
    records: tuple[WriteRecord, ...] = ()
    gpus: tuple[Mapping[str, Any], ...] = ()
    use: ChildGpuUse | None = None  # this sample's join: what the run's processes hold now
    held: ChildGpuUse | None = None  # the run's GPU use, where its pids are on the GPUs
    tree: frozenset[int] = frozenset()  # the run's pids on the GPUs (remembered for the join)
    xids: tuple[int, ...] = ()  # XID errors on the GPUs the run holds memory on
    active: bool = False  # a kernel ran on the run's GPUs: liveness
    busy: bool = False  # the run's GPUs were busy for ``gpu_busy_s`` in a row
    power_w: float | None = None  # the power its GPUs draw together (None: unknown)


@dataclass(frozen=True, slots=True)
class SlowCauses:
    """The answer to :class:`~dflashd.supervisor.model.effects.LookForSlowCauses`: what the
    host says slowed run ``run_no`` down."""

    run_no: int
    causes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SlowStacks:
    """The stacks taken at run ``run_no``'s slowdown came back: their ``stacks`` record
    (``said``), and what they found (``fields``: the odd rank out, its ranks)."""

    run_no: int
    said: WriteRecord
    fields: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Reaped:
    """Run ``run_no``'s root was reaped: what the host says of its end (its exit code or
    signal; ``status_unknown``: someone else took its wait status), its CPU time, its pipes'
    last lines and how many lines it wrote, the OOM kills in its cgroup, the NCCL traces its
    ranks left, the JIT-build locks older than it.  The model builds the facts ``conclude``
    judges from its own state (model/died.py); ``jitter``: the backoff's, in [0, 1)."""

    run_no: int
    exit_code: int | None
    signal: int | None
    died_mono: float
    ended_at: float
    cpu_s: float | None = None
    tails: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # by pipe: stdout, stderr
    output_lines: int = 0
    status_unknown: bool = False
    oom_kills: int = 0
    flight_recorder: tuple[str, ...] = ()
    stale_build_locks: tuple[str, ...] = ()
    jitter: float = 0.0


@dataclass(frozen=True, slots=True)
class StallLook:
    """The live run passed its progress deadline: what the host says of it now (one of its
    processes is runnable; the CPU time of all of them, None: not known; a torchrun agent's
    workers run, past its rendezvous even if nothing said so)."""

    run_no: int
    runnable: bool
    cpu_used_s: float | None
    workers_run: bool = False


@dataclass(frozen=True, slots=True)
class StatusChanged:
    """Something status shows changed: state.json is written within the throttle."""


@dataclass(frozen=True, slots=True)
class StatusWritten:
    """The status was just written."""


@dataclass(frozen=True, slots=True)
class StartupView:
    """What the start-up decider needs of a run with no first step yet (the shell's)."""

    started_mono: float
    stacks_available: bool
    stale_lock: bool  # a build lock older than the run where torch builds its extensions
    held: tuple[tuple[str, float], ...] = ()  # those locks' paths and ages (a round judged)


@dataclass(frozen=True, slots=True)
class HangLook:
    """The live run looked at for a hang, or for a stuck start-up (``view`` None: no first
    step yet): what the shell knows of it now.  ``sample``: one that just came back (its
    dump kept); ``share``: what a round that begins now shares with the other nodes;
    ``step``: the run's step, for a round's ``hang_suspect`` record.  The model keeps the
    run's hang watch."""

    view: HangView | None
    startup: StartupView | None
    limits: HangLimits
    wall: float
    share: Share | None = None
    step: int | None = None
    sample: tuple[Sample, StacksDump] | None = None


@dataclass(frozen=True, slots=True)
class DumpRead:
    """A stacks dump of run ``run_no`` came back, its files written: its ``stacks`` record
    (``said``), what the run keeps of it (``kept``), whether py-spy read the run (``ok``; else
    ``error``), what asked for it, and whether the run still lives."""

    run_no: int
    dump_id: str
    said: WriteRecord
    kept: Mapping[str, Any]
    ok: bool
    trigger: str
    error: str | None
    alive: bool


@dataclass(frozen=True, slots=True)
class StacksAsked:
    """``dflashd stacks``: a dump of the live run (``native``: with native frames)."""

    native: bool = False


@dataclass(frozen=True, slots=True)
class HangDumpWritten:
    """The sample that proved run ``run_no`` hung, written as its dump (``said``: its
    ``stacks`` record, None when no sample was kept; ``kept``: what the run keeps of it), and
    whether the run still lives."""

    run_no: int
    said: WriteRecord | None
    kept: Mapping[str, Any] | None
    alive: bool


Input = (
    Started
    | ChildExited
    | Launched
    | LaunchPutOff
    | StopRequested
    | DeadlineDue
    | ReleaseLooked
    | Emptied
    | CarriedOver
    | LinesSeen
    | NotifyRead
    | GpuSeen
    | SlowCauses
    | SlowStacks
    | Reaped
    | StallLook
    | StatusChanged
    | StatusWritten
    | HangLook
    | DumpRead
    | HangDumpWritten
    | StacksAsked
)
