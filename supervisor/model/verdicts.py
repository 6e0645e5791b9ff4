"""Why a run ended (docs/design.md, "Verdicts"): a pure classifier from observations to a verdict and a reason.

No clock, no I/O, no logging: every input is in :class:`Observations`, so the whole
decision is tested as a table.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, TypeAlias


class Verdict(StrEnum):
    """The verdicts of docs/design.md ("Verdicts")."""

    SPAWN_FAILED = "spawn_failed"
    SILENT_DEATH = "silent_death"
    CRASH_BEFORE_FIRST_STEP = "crash_before_first_step"
    NO_GPU_MEMORY = "no_gpu_memory"
    STALLED = "stalled"
    RENDEZVOUS_TIMEOUT = "rendezvous_timeout"  # a node of a larger job waited for its peers in vain
    CRASHED = "crashed"
    COMPLETED = "completed"
    STOPPED = "stopped"
    LOST = "lost"  # the daemon was killed while the run lived; the next daemon says so
    DIVERGED = "diverged"  # its loss went NaN/infinite or left its range: ended on_diverge = "stop"


EARLY_DEATHS: Final = frozenset(
    {
        Verdict.SPAWN_FAILED,
        Verdict.SILENT_DEATH,
        Verdict.CRASH_BEFORE_FIRST_STEP,
        Verdict.NO_GPU_MEMORY,
    }
)
EARLY_DEATH_NAMES: Final = frozenset(v.value for v in EARLY_DEATHS)


class Notice(StrEnum):
    """What an alert is about besides a verdict."""

    FATAL = "fatal"  # dflashd gave up
    RECOVERED = "recovered"  # training resumed past the step of a stall or a fatal
    WAITING = "waiting"  # alive, waiting past remote_wait_s on work elsewhere (not ended)
    SLOW = "slow"  # stepping 20 % or more below its own baseline, sustained (never ended for it)
    GPU_UNUSABLE = "gpu_unusable"  # a GPU needs a reset or a reboot: never relaunched onto


class RuleVerdict(str):
    """A verdict a rule of the registry names (:mod:`~dflashd.supervisor.model.rules`), not
    one of the built-in :class:`Verdict` members; reads as its name, as they do."""

    __slots__ = ()

    @property
    def value(self) -> str:
        """Its name (as a :class:`Verdict` member's ``value``)."""
        return str.__str__(self)


AnyVerdict: TypeAlias = Verdict | RuleVerdict
AlertKind: TypeAlias = Verdict | Notice | RuleVerdict  # a verdict (built in or a rule's), a notice
ALERT_KINDS: Final[tuple[AlertKind, ...]] = (*Verdict, *Notice)  # the built-in ones


def alert_kind(name: str) -> AlertKind:
    """The alert kind called ``name`` (ValueError: there is none)."""
    try:
        return Verdict(name)
    except ValueError:
        return Notice(name)


# Alerted by default: every early death, a stall, a give-up and a recovery.
DEFAULT_ALERTS: Final = (
    Verdict.SPAWN_FAILED,
    Verdict.SILENT_DEATH,
    Verdict.CRASH_BEFORE_FIRST_STEP,
    Verdict.NO_GPU_MEMORY,
    Verdict.STALLED,
    Verdict.RENDEZVOUS_TIMEOUT,
    Notice.FATAL,
    Notice.RECOVERED,
    Notice.WAITING,
    Notice.SLOW,
    Verdict.DIVERGED,
    Notice.GPU_UNUSABLE,
)


class EndedBy(StrEnum):
    """Who ended the run when it was not the child's own doing."""

    CHILD = "child"
    STOP = "stop"
    FIRST_STEP_TIMEOUT = "first_step_timeout"
    RENDEZVOUS_TIMEOUT = "rendezvous_timeout"  # a torchrun agent still waiting for its peers
    NO_PROGRESS = "no_progress"
    HUNG = "hung"  # stacks unmoved in waits, sampled while suspect (hang.py)
    NO_GPU_MEMORY = "no_gpu_memory"
    DIVERGED = "diverged"  # its loss diverged, and on_diverge = "stop" (or it did so twice)
    DAEMON_DIED = "daemon_died"  # the daemon was killed while the run lived: its end was unseen


@dataclass(frozen=True, slots=True)
class Observations:
    """Everything the classifier may look at, gathered by the daemon when a run ends."""

    spawn_error: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    ended_by: EndedBy = EndedBy.CHILD
    reached_first_step: bool = False
    output_lines: int = 0
    stderr_tail: tuple[str, ...] = ()
    gpu_xids: tuple[int, ...] = ()
    status_unknown: bool = False  # the child is gone but its wait status could not be read
    oom_kills: int = 0  # the run cgroup's memory.events oom_kill (cgroup mode, memory controller)
    lived_s: float = 0.0  # from the launch to the last sign of life (output, notify, GPU, CPU)
    cpu_s: float = 0.0  # CPU time the run's processes used (wait4, its cgroup)
    diverged: tuple[int | None, int | None] | None = None  # its loss: (began at, last good step)


@dataclass(frozen=True, slots=True)
class Classification:
    """A verdict and the detail that explains it."""

    verdict: AnyVerdict
    reason: str


# Hardware faults that end runs through no fault of the code (NVIDIA's XID catalogue).
HARDWARE_XIDS: Final = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120})

_REASON_PATTERNS: Final = (
    (re.compile(r"(ModuleNotFoundError|ImportError)\b"), "import_error"),
    (re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory"), "cuda_oom"),
    (re.compile(r"CUDA error|cudaError|CUBLAS_STATUS|NCCL error"), "cuda_error"),
    (re.compile(r"\bMemoryError\b"), "host_oom"),
    (re.compile(r"\b(?:SyntaxError|IndentationError|TabError)\b"), "syntax_error"),
    (re.compile(r"torch\._(?:dynamo|inductor)\.config\b|InvalidBackend\b"), "compile_config_error"),
    (re.compile(r"Fatal Python error"), "fatal_python_error"),
    (re.compile(r"\bRendezvousTimeoutError\b"), "rendezvous_timeout"),
)
_RANK_PREFIX: Final = re.compile(r"^\[(?:rank|default)[0-9]{1,6}\]:\s*")  # torch's worker prefix
_EXCEPTION_LINE: Final = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt))\b")


# Failures before the first step that a retry cannot fix: the code or the environment is wrong.
UNFIXABLE_REASONS: Final = frozenset({"import_error", "syntax_error", "compile_config_error"})


def signal_name(signum: int) -> str:
    """``SIGSEGV`` for 11; ``SIGRTMIN+3`` for a real-time signal between the two ends (as
    ``kill -l`` names it); ``SIG<n>`` for numbers Python has no name for."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        low, high = getattr(signal, "SIGRTMIN", 0), getattr(signal, "SIGRTMAX", 0)
        if low < signum < high:
            return f"SIGRTMIN+{signum - low}"
        return f"SIG{signum}"


def reason_from_output(stderr_tail: tuple[str, ...]) -> str | None:
    """A short cause read from the last stderr lines (``import_error``, ``cuda_oom``…), if any."""
    text = "\n".join(stderr_tail)
    for pattern, reason in _REASON_PATTERNS:
        if pattern.search(text):
            return reason
    for line in reversed(stderr_tail):
        match = _EXCEPTION_LINE.match(_RANK_PREFIX.sub("", line.strip(), count=1))
        if match:
            return match.group(1).rsplit(".", 1)[-1]
    return None


def _hardware_xid(obs: Observations) -> str | None:
    for xid in obs.gpu_xids:
        if xid in HARDWARE_XIDS:
            return f"gpu_xid_{xid}"
    return None


def _death_reason(obs: Observations) -> str:
    hardware = _hardware_xid(obs)
    if hardware is not None:
        return hardware
    from_output = reason_from_output(obs.stderr_tail)
    if obs.oom_kills > 0 and obs.signal in (None, signal.SIGKILL):
        return "oom_killed"  # the kernel's OOM killer, seen in the run cgroup's memory.events
    if obs.signal is not None:
        name = signal_name(obs.signal)
        # A SIGABRT/SIGSEGV with a recognisable cause names both: "SIGABRT:cuda_error".
        return f"{name}:{from_output}" if from_output else name
    if from_output:
        return from_output
    if obs.status_unknown or obs.exit_code is None:
        return "exit_status_unknown"
    return f"exit_code_{obs.exit_code}"


NO_STEP_SEEN: Final = "no_step_seen"
DEFAULT_EARLY_DEATH_S: Final = 300.0


BUSY_CPU_S: Final = 10.0  # CPU-seconds of work before a death that make it a runtime crash
_FRAME_FILE: Final = re.compile(r'^\s*File "([^"]+)", line \d+')
_LIBRARY_FILE: Final = re.compile(
    r"[/\\](?:site|dist)-packages[/\\]|[/\\]lib[/\\]python3[.\d]*[/\\]"
)


def _busy_then_raised(obs: Observations) -> bool:
    """A run that worked (``BUSY_CPU_S`` of CPU, with output) and then raised from its own code
    is a runtime crash though no step was seen (DeepSpeed's defaults print none): the last
    frame of its traceback is the job's file, not a library's, and the cause is no unfixable
    one (an ImportError stays an early death)."""
    if obs.cpu_s < BUSY_CPU_S or obs.output_lines == 0:
        return False
    frames = [m.group(1) for line in obs.stderr_tail if (m := _FRAME_FILE.match(line))]
    if not frames or _LIBRARY_FILE.search(frames[-1]):
        return False
    return reason_from_output(obs.stderr_tail) not in UNFIXABLE_REASONS


def classify(obs: Observations, early_death_s: float = DEFAULT_EARLY_DEATH_S) -> Classification:
    """The verdict for one ended run (docs/design.md, "Verdicts").

    An early death is a death in the start-up: a run that showed signs of life for
    ``early_death_s`` or more before dying is a runtime crash even when no step was seen
    (a bar that never reaches the pipe, a trainer that prints nothing): ``crashed`` with
    the reason ``<cause>:no_step_seen``.
    """
    if obs.spawn_error is not None:
        return Classification(Verdict.SPAWN_FAILED, obs.spawn_error)
    if obs.ended_by is EndedBy.DAEMON_DIED:
        return Classification(Verdict.LOST, "daemon_killed")
    if obs.ended_by is EndedBy.STOP:
        return Classification(Verdict.STOPPED, "stop_requested")
    if obs.ended_by is EndedBy.DIVERGED:
        began, good = obs.diverged or (None, None)
        return Classification(Verdict.DIVERGED, f"loss_diverged_at_step_{began}_last_good_{good}")
    if obs.ended_by in (EndedBy.FIRST_STEP_TIMEOUT, EndedBy.NO_PROGRESS, EndedBy.HUNG):
        hardware = _hardware_xid(obs)  # a hang after a GPU fell off the bus: the XID explains it
        return Classification(Verdict.STALLED, hardware or obs.ended_by.value)
    if obs.ended_by is EndedBy.RENDEZVOUS_TIMEOUT:
        return Classification(Verdict.RENDEZVOUS_TIMEOUT, "first_step_timeout_in_rendezvous")
    if obs.ended_by is EndedBy.NO_GPU_MEMORY:
        return Classification(Verdict.NO_GPU_MEMORY, "no_gpu_memory_before_first_step")
    if obs.exit_code == 0 and not obs.status_unknown:
        return Classification(Verdict.COMPLETED, "exit_code_0")
    if not obs.reached_first_step:
        if (
            reason_from_output(obs.stderr_tail) == "rendezvous_timeout"
        ):  # torchrun's own join timeout
            return Classification(Verdict.RENDEZVOUS_TIMEOUT, "agent_join_timeout")
        if obs.lived_s >= early_death_s or _busy_then_raised(obs):
            return Classification(Verdict.CRASHED, f"{_death_reason(obs)}:{NO_STEP_SEEN}")
        if obs.output_lines == 0:
            return Classification(Verdict.SILENT_DEATH, _death_reason(obs))
        return Classification(Verdict.CRASH_BEFORE_FIRST_STEP, _death_reason(obs))
    return Classification(Verdict.CRASHED, _death_reason(obs))


@dataclass(frozen=True, slots=True)
class RoomHold:
    """A relaunch held until the filesystem holding ``path`` (empty: the job's working
    directory) has room again: at least ``min_free_bytes`` free, or ``min_free_share`` of
    its size on a small one."""

    path: str
    min_free_bytes: int = 1 << 30
    min_free_share: float = 0.05

    def ready(self, free: int, size: int) -> bool:
        """The filesystem (``free`` of ``size`` bytes) has room for the job again."""
        return free >= min(self.min_free_bytes, int(size * self.min_free_share))

    def describe(self) -> str:
        """What the relaunch waits for, in words."""
        return f"room on {self.path or 'the job’s working directory'}"


@dataclass(frozen=True, slots=True)
class Found:
    """What a rule read in a dead run's evidence: the reason, and what a relaunch must wait for
    (None: the restart policy alone decides when)."""

    reason: str
    hold: RoomHold | None = None


@dataclass(frozen=True, slots=True)
class Rule:
    """One verdict read from a dead run's evidence, ahead of the built-in ``crashed`` and
    ``crash_before_first_step`` (docs/design.md, "Verdicts"): the evidence it reads (its
    output tail and the top frames of the stacks taken before its end: ``reads`` gives what it
    found, or None), whether it alerts by default, its colours (terminal, report) and one
    line of what it means.  Its policy: the restart policy's, and a relaunch held until the
    host shows what ``Found.hold`` names."""

    verdict: RuleVerdict
    reads: Callable[[Observations, tuple[str, ...]], Found | None]
    meaning: str
    alert: bool = True
    colour: str = "magenta"
    html_colour: str = "#00838f"
