"""Hangs found from evidence, not from time: the pure decider (docs/design.md, "Hangs").

Once a run has shown a steady step cadence, a gap of ``max(hang_suspect_s, 6 x`` its
typical interval``)`` with no new step makes it *suspect*.  Suspicion ends nothing: dflashd
then samples every Python process of the run a few seconds apart (py-spy, non-blocking:
the job keeps running) with each process's I/O and thread states, and :func:`judge` reads
the samples:

- **hung**: in every sample, every judged thread sits in a wait (a lock, a sleep, a
  ``select``/``poll``, a socket or pipe read, a collective, a CUDA synchronize), and no
  thread's stack moved between samples, and no judged process wrote a byte;
- **working**: a stack moved, a process wrote (a checkpoint), or a thread is in an
  uninterruptible I/O wait (state D) or runs outside any wait (a long kernel in C);
- **unknown**: no stacks at all (py-spy missing, ptrace refused): today's window decides
  (``stall_timeout_s`` and the cadence rule), as before.

No false kill is the first property, speed the second: only *hung* ends a run early.  With
torchrun, the workers are judged (the agent's monitor loop is not the job).

:func:`decide` is the one function of (the run's view, the evidence, now, limits) that says
what to do next; it is table-tested like :func:`dflashd.supervisor.model.ending.conclude`.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final

from dflashd.supervisor.model.gpuspin import gpu_wait, spinning_power, spun_s
from dflashd.supervisor.model.stacks import StacksDump
from dflashd.supervisor.model.threadwaits import WaitKind, waiting, waiting_on
from dflashd.supervisor.model.world import (
    ProcessSample,
    WorldHeard,
    someone_works,
    waits_elsewhere,
    world_decides,
    world_stuck,
)

HANG_SUSPECT_S: Final = 12.0  # the shortest gap that makes a steady run suspect
CADENCE_FACTOR: Final = 6.0  # ... or this many typical intervals, if longer
STEADY_INTERVALS: Final = 5  # intervals seen before a cadence counts as steady
SAMPLES: Final = 3  # samples that must agree before a run is hung
SAMPLE_GAP_S: Final = 3.0  # between two samples of one round
ROUND_GAP_S: Final = 15.0  # after a round that found work (or could not tell), the next one
# The quick look (issue 51): a steady run silent for QUICK_FACTOR typical intervals (at least
# QUICK_SUSPECT_S) is sampled QUICK_GAP_S apart; only while every sign says nothing moves
# (see :func:`work_sign`) may its round end the run, else the long path above decides.
QUICK_SUSPECT_S: Final = 4.0
QUICK_FACTOR: Final = 4.0
QUICK_GAP_S: Final = 1.0
QUIET_CPU: Final = 0.05  # of one CPU, every process of the run together, over the look
QUIET_BYTES: Final = 4096  # read or written by any process of the run over the look
PAUSE_MARGIN: Final = 1.5  # x the longest pause the run came back from
# A wait on work elsewhere is alerted once after this long: longer than most evals and saves,
# well short of the stall window (15 min) that ends a run in which nothing moves at all.
REMOTE_WAIT_S: Final = 300.0


class Finding(Enum):
    """What a round of samples says about a suspect run."""

    HUNG = "hung"
    WORKING = "working"
    ELSEWHERE = "elsewhere"  # waits on work outside this node's run: never ended for it
    UNKNOWN = "unknown"  # no stacks: the time window decides
    UNDECIDED = "undecided"  # not enough samples yet
    GPU_WAIT = "gpu_wait"  # every process waits on its busy GPU, unmoved (gpu_spin after a while)


@dataclass(frozen=True, slots=True)
class Sample:
    """Every process of the run at one moment (one that is not Python: no stacks, an error)."""

    at: float
    processes: tuple[ProcessSample, ...]
    world: WorldHeard | None = None  # what the other nodes said (model/world.py), if asked


NATIVE_BUSY_CPU: Final = 0.1  # of one CPU over a round: a thread py-spy cannot see computes
# Bytes moved over a round that count as work: a heartbeat line or a log line a side thread
# appends is not; a checkpoint (megabytes) or a stream from a slow server (100 KB/s) is.
WORK_BYTES: Final = 64 * 1024


@dataclass(frozen=True, slots=True)
class HangSampled:
    """Inbox message: a sample of run ``run_no`` taken on a thread (its dump kept for the file)."""

    run_no: int
    sample: Sample
    dump: StacksDump


@dataclass(frozen=True, slots=True)
class Judgement:
    """A finding, why, and (for a hang) the frames that proved it."""

    finding: Finding
    why: str
    frames: tuple[str, ...] = ()
    key: int | None = None  # GPU_WAIT: the stacks and locals that must stay the same


def _judged(sample: Sample) -> list[ProcessSample]:
    """The processes a finding is about: the workers when torchrun runs them, else all."""
    usable = [p for p in sample.processes if p.stacks.error is None and p.stacks.threads]
    workers = [p for p in usable if p.stacks.role.kind == "worker"]
    return workers or usable


def _signature(process: ProcessSample) -> tuple[tuple[int, tuple[str, ...]], ...]:
    return tuple(
        (t.tid, tuple(f.text() for f in t.frames))
        for t in sorted(process.stacks.threads, key=lambda t: t.tid)
    )


def _locals(process: ProcessSample) -> tuple[int, ...]:
    return tuple(t.locals_key for t in sorted(process.stacks.threads, key=lambda t: t.tid))


def _frames(last: dict[int, ProcessSample]) -> tuple[str, ...]:
    """Each process's top frame, with its role: the evidence a finding names."""
    return tuple(
        f"pid {p.stacks.pid} {p.stacks.role.label()}: {(p.stacks.top() or ['?'])[0]}"
        for p in last.values()
    )


def _busy_unseen(samples: list[Sample], judged: dict[int, ProcessSample]) -> str | None:
    """Work the stacks cannot show: a process of the run that is not Python (running, in
    I/O, using CPU or writing), or a judged one whose threads all wait on the CPU side while
    it uses CPU (a native thread pool computing under a waiting Python thread).  A process
    in a collective or a GPU wait may spin a CPU while hung: its CPU says nothing."""
    span = samples[-1].at - samples[0].at
    if span <= 0:
        return None
    firsts = {p.stacks.pid: p for p in samples[0].processes}
    for process in samples[-1].processes:
        pid = process.stacks.pid
        before = firsts.get(pid)
        if before is None or before.cpu_s is None or process.cpu_s is None:
            continue
        used = (process.cpu_s - before.cpu_s) / span
        if process.stacks.error is not None:  # not Python (or unreadable): its OS view only
            states = {s for p in (before, process) for s in p.thread_states}
            wrote = (process.wrote_bytes or 0) > (before.wrote_bytes or 0)
            if used >= NATIVE_BUSY_CPU or wrote or states & {"R", "D"}:
                return f"pid {pid} (no Python stacks) is busy: {used:.0%} of a CPU"
        elif pid in judged and used >= NATIVE_BUSY_CPU:
            kinds = {waiting_on(t) for t in process.stacks.threads}
            in_collective = any(f.collective for t in process.stacks.threads for f in t.frames)
            if kinds == {WaitKind.CPU} and not in_collective:
                return f"pid {pid} uses {used:.0%} of a CPU under waiting Python threads"
    return None


def judge(samples: list[Sample], gpu_idle: bool = False) -> Judgement:
    """Read a round of samples (oldest first): hung, working, unknown, or not yet.

    ``gpu_idle``: the run's GPUs were idle at the last GPU sample (False: busy, or unknown).
    """
    judged = [{p.stacks.pid: p for p in _judged(s)} for s in samples]
    if not samples:
        return Judgement(Finding.UNDECIDED, "no sample yet")
    if not any(judged):
        return Judgement(Finding.UNKNOWN, "no stacks could be read")
    for one in judged:
        for process in one.values():
            if "D" in process.thread_states:
                return Judgement(Finding.WORKING, f"pid {process.stacks.pid} in an I/O wait (D)")
            busy = [t for t in process.stacks.threads if not waiting(t)]
            if busy:
                top = busy[0].frames[0].text() if busy[0].frames else busy[0].name
                return Judgement(Finding.WORKING, f"pid {process.stacks.pid} runs {top}")
    first, last = judged[0], judged[-1]
    unseen = _busy_unseen(samples, first)
    if unseen is not None:
        return Judgement(Finding.WORKING, unseen)
    for pid, before in first.items():
        after = last.get(pid)
        if after is None:
            continue
        for verb, was, now in (
            ("wrote", before.wrote_bytes, after.wrote_bytes),
            ("read", before.read_bytes, after.read_bytes),
        ):
            if was is not None and now is not None and now - was >= WORK_BYTES:
                return Judgement(Finding.WORKING, f"pid {pid} {verb} {now - was} bytes")
    for earlier, later in itertools.pairwise(judged):
        for pid, process in later.items():
            if pid in earlier and _signature(earlier[pid]) != _signature(process):
                return Judgement(Finding.WORKING, f"pid {pid}'s stacks moved")
        if set(later) != set(earlier):
            return Judgement(Finding.WORKING, "the run's processes changed")
    if len(samples) < SAMPLES:
        return Judgement(Finding.UNDECIDED, f"{len(samples)} of {SAMPLES} samples agree")
    on_gpu = [
        p for p in last.values() if any(waiting_on(t) is WaitKind.GPU for t in p.stacks.threads)
    ]
    if on_gpu and not gpu_idle and len(on_gpu) == len(last):
        # every process waits for a busy GPU: a GPU-bound loop (an eval) looks exactly so,
        # unless its loop variables stand still too (a kernel that never returns)
        digests = [{pid: _locals(p) for pid, p in one.items()} for one in (judged[0], last)]
        found = gpu_wait(digests[0], digests[1], tuple(_signature(p) for p in last.values()))
        if found.key is None:
            return Judgement(Finding.WORKING, found.why)
        return Judgement(Finding.GPU_WAIT, found.why, _frames(last), found.key)
    frames = _frames(last)
    span = samples[-1].at - samples[0].at
    elsewhere = waits_elsewhere(list(last.values()))
    if elsewhere is not None:
        return Judgement(Finding.ELSEWHERE, elsewhere, frames)
    return Judgement(Finding.HUNG, f"every thread waits, unmoved for {span:.0f}s", frames)


# -- the decider ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HangView:
    """What the decider needs of a live run."""

    last_progress: float | None  # monotonic time of the last new step (None: none yet)
    intervals: tuple[float, ...]  # the job's recent step intervals
    reports_steps: bool  # the job's own step numbers are seen (not just liveness)
    stacks_available: bool  # py-spy can be used
    sampling: bool = False  # a sample is being taken now
    gpu_idle: bool = False  # the run's GPUs were idle at the last sample (False: busy or unknown)
    node: int | None = None  # this node's group rank in a job of many nodes (None: unknown)
    gpu_power_share: float | None = None  # its GPUs' power now / while stepping (gpuspin.py)
    # restarts its launcher handled (torchrun re-formed the group), and when the last began:
    # each starts the judgment afresh (model/hangwatch.py's ``afresh``)
    worker_rounds: int = 0
    restarted_at: float | None = None
    longest_pause_s: float = 0.0  # the longest silence it stepped again after (its own pauses)


@dataclass(frozen=True, slots=True)
class HangLimits:
    """``hang_suspect_s`` (0: hang detection off); ``remote_wait_s``: how long a run may wait
    on work elsewhere (a remote rank, a lock another job holds) before one alert says so."""

    hang_suspect_s: float = HANG_SUSPECT_S
    remote_wait_s: float = REMOTE_WAIT_S


@dataclass(frozen=True, slots=True)
class Evidence:
    """The samples of the current round and when the next round may begin; since when the
    rounds have found the run waiting elsewhere, and whether that was alerted."""

    samples: tuple[Sample, ...] = ()
    next_round_at: float | None = None
    elsewhere_since: float | None = None
    elsewhere_alerted: bool = False
    gpu_wait: tuple[int, float] | None = None  # the same GPU wait (its key) seen since
    quick: bool = False  # the round under way is a quick look
    quick_for: float | None = None  # the last step whose silence had its quick look


@dataclass(frozen=True, slots=True)
class HangWatch:
    """One run's hang evidence: replaced by the arms below, never changed."""

    samples: tuple[Sample, ...] = ()
    next_round_at: float | None = None
    sampling: bool = False
    rounds: int = 0
    last_finding: str | None = None
    last_kind: Finding | None = None  # the last round's finding (shared with the other nodes)
    last_world: str | None = None  # what the other nodes said at the last round, in words
    # what the run waits on, for status: a wait elsewhere, or a start-up named (startup.py)
    waiting: dict[str, Any] | None = None
    last_dump: StacksDump | None = None  # the latest sample's stacks: the file if it proves a hang
    elsewhere_since: float | None = None  # rounds in a row found it waiting elsewhere since
    elsewhere_alerted: bool = False
    # the last wait elsewhere (why, since, last seen), kept through a round that found
    # otherwise (a crash's round) until a new step: a run that dies of a lost peer says so
    elsewhere_last: tuple[str, float, float] | None = None
    gpu_wait: tuple[int, float] | None = None  # the same unmoved wait on a busy GPU, since
    worker_rounds: int = 0  # the launcher's restarts this watch has judged since
    quick: bool = False  # the round under way is a quick look (hang.py's decide)
    quick_for: float | None = None  # the last step whose silence had its quick look

    def evidence(self) -> Evidence:
        """The deciders' view of it."""
        return Evidence(
            self.samples,
            self.next_round_at,
            self.elsewhere_since,
            self.elsewhere_alerted,
            self.gpu_wait,
            self.quick,
            self.quick_for,
        )


@dataclass(frozen=True, slots=True)
class Wait:
    """Nothing to do before ``until`` (None: nothing to wait for)."""

    until: float | None


@dataclass(frozen=True, slots=True)
class TakeSample:
    """Sample every process of the run now (``quick``: a quick look begins, see :func:`decide`)."""

    quick: bool = False


@dataclass(frozen=True, slots=True)
class EndHung:
    """End the run as ``stalled``/``hung``: the judgement, and the gap since the last step."""

    judgement: Judgement
    hung_after_s: float


@dataclass(frozen=True, slots=True)
class NewRound:
    """The round found work, a wait elsewhere, or could not tell: forget its samples, look
    again at ``at``; ``alert``: the run has waited elsewhere ``remote_wait_s`` (said once)."""

    judgement: Judgement
    at: float
    alert: bool = False


@dataclass(frozen=True, slots=True)
class QuickOver:
    """A quick look saw a sign of work (``why``): its samples are forgotten, in silence, and
    the long path looks at ``at`` (one quick look per silence)."""

    at: float
    why: str


HangAction = Wait | TakeSample | EndHung | NewRound | QuickOver


def suspect_after(intervals: tuple[float, ...], limits: HangLimits) -> float | None:
    """The gap after which a run is suspect, or None before its cadence is steady."""
    if limits.hang_suspect_s <= 0 or len(intervals) < STEADY_INTERVALS:
        return None
    typical = statistics.median(intervals)
    return max(limits.hang_suspect_s, CADENCE_FACTOR * typical)


def quick_after(
    intervals: tuple[float, ...], limits: HangLimits, longest_pause_s: float = 0.0
) -> float | None:
    """The gap after which a steady run gets its quick look (None: none before the long gap):
    a multiple of its cadence, at least :data:`QUICK_SUSPECT_S`, and half again the longest
    pause it came back from (a checkpoint or an eval that took 6 s is looked at after 9 s)."""
    gap = suspect_after(intervals, limits)
    if gap is None:
        return None
    typical = statistics.median(intervals)
    quick = max(QUICK_SUSPECT_S, QUICK_FACTOR * typical, PAUSE_MARGIN * longest_pause_s)
    return quick if quick < gap else None


def work_sign(samples: list[Sample], view: HangView) -> str | None:
    """A sign of work in a quick look's samples (None: nothing moves at all): a thread that
    runs or sits in I/O, a wait whose other end is elsewhere (another node, another job), a
    wait on a GPU that is busy, CPU used, bytes read or written, a process come or gone."""
    if any(not p.stacks.threads or p.stacks.error for s in samples for p in s.processes):
        return "a process of the run has no Python stacks"
    for sample in samples:
        for process in sample.processes:
            if {"D", "R"} & set(process.thread_states) and len(samples) > 1:
                return f"pid {process.stacks.pid} has a thread running or in I/O"
            if not all(waiting(t) for t in process.stacks.threads):
                return f"pid {process.stacks.pid} runs"
    last = samples[-1].processes
    if waits_elsewhere(list(last)) is not None:
        return "it waits on work elsewhere"
    gpu_quiet = view.gpu_idle or spinning_power(view.gpu_power_share)
    on_gpu = any(waiting_on(t) is WaitKind.GPU for p in last for t in p.stacks.threads)
    if on_gpu and not gpu_quiet:
        return "it waits on a GPU that may be busy"
    if len(samples) < 2:
        return None
    first = {p.stacks.pid: p for p in samples[0].processes}
    if set(first) != {p.stacks.pid for p in last}:
        return "the run's processes changed"
    span = max(samples[-1].at - samples[0].at, 1e-3)
    cpu = 0.0
    for process in last:
        before = first[process.stacks.pid]
        if _signature(before) != _signature(process):
            return f"pid {process.stacks.pid}'s stacks moved"
        if before.cpu_s is None or process.cpu_s is None:
            return f"pid {process.stacks.pid}'s CPU time could not be read"
        cpu += max(0.0, process.cpu_s - before.cpu_s)
        for was, now in (
            (before.wrote_bytes, process.wrote_bytes),
            (before.read_bytes, process.read_bytes),
        ):
            if was is None or now is None or now - was >= QUIET_BYTES:
                return f"pid {process.stacks.pid} moved bytes (or they could not be read)"
    if cpu / span >= QUIET_CPU:
        return f"the run used {cpu / span:.0%} of a CPU"
    return None


def _quick(view: HangView, evidence: Evidence, now: float, gap: float) -> HangAction | None:
    """The quick look (None: not now, the long path decides): sampled ``QUICK_GAP_S`` apart
    while nothing moves; three quiet samples that :func:`judge` finds hung end the run; the
    first sign of work hands the silence back to the long path (one look per silence)."""
    last = view.last_progress
    assert last is not None
    if not evidence.quick:
        if evidence.quick_for == last or evidence.samples or not view.stacks_available:
            return None
        return None if view.sampling else TakeSample(quick=True)
    if view.sampling:
        return Wait(None)
    samples = list(evidence.samples)
    sign = work_sign(samples, view) if samples else None
    back = max(now, last + gap)  # the long path's suspicion
    if sign is not None:
        return QuickOver(back, sign)
    if len(samples) < SAMPLES:
        at = samples[-1].at + QUICK_GAP_S if samples else now
        return Wait(at) if now < at else TakeSample(quick=True)
    verdict = judge(samples, view.gpu_idle)
    if verdict.finding is Finding.HUNG:
        return EndHung(verdict, round(now - last, 3))
    return QuickOver(back, verdict.why)


def decide(view: HangView, evidence: Evidence, now: float, limits: HangLimits) -> HangAction:
    """What to do about a live run's possible hang, now (pure)."""
    gap = suspect_after(view.intervals, limits)
    if gap is None or view.last_progress is None or not view.reports_steps:
        return Wait(None)
    suspect_at = view.last_progress + gap
    quick = quick_after(view.intervals, limits, view.longest_pause_s)
    if quick is not None and (evidence.quick or evidence.quick_for != view.last_progress):
        quick_at = view.last_progress + quick
        if now < quick_at:
            return Wait(quick_at)
        looked = _quick(view, evidence, now, gap)
        if looked is not None:
            return looked
    if now < suspect_at:
        return Wait(suspect_at)
    if not view.stacks_available:
        return Wait(None)  # unknown: the stall window decides, as before
    if view.sampling:
        return Wait(None)  # the sample in flight posts back
    if evidence.next_round_at is not None and now < evidence.next_round_at:
        return Wait(evidence.next_round_at)
    samples = list(evidence.samples)
    if samples:
        verdict = judge(samples, view.gpu_idle)
        if verdict.finding is Finding.HUNG:
            return EndHung(verdict, round(now - view.last_progress, 3))
        if verdict.finding is Finding.GPU_WAIT:
            spun = spun_s(verdict.key, evidence.gpu_wait, now)
            if spun is not None and spinning_power(view.gpu_power_share):
                why = f"gpu_spin: {verdict.why} for {spun:.0f}s (a kernel that never returns)"
                return EndHung(
                    Judgement(Finding.HUNG, why, verdict.frames), round(now - view.last_progress, 3)
                )
            return NewRound(verdict, now + ROUND_GAP_S)
        if verdict.finding is Finding.ELSEWHERE:
            since = evidence.elsewhere_since if evidence.elsewhere_since is not None else now
            heard = next((s.world for s in reversed(samples) if s.world is not None), None)
            stuck = world_stuck(heard, view.node, now - since, limits.remote_wait_s)
            if stuck is not None:
                judged = Judgement(Finding.HUNG, f"{stuck} (here: {verdict.why})", verdict.frames)
                return EndHung(judged, round(now - view.last_progress, 3))
            due = now - since >= limits.remote_wait_s and not evidence.elsewhere_alerted
            quiet = someone_works(heard) or world_decides(heard)
            return NewRound(verdict, now + ROUND_GAP_S, alert=due and not quiet)
        if verdict.finding in (Finding.WORKING, Finding.UNKNOWN):
            return NewRound(verdict, now + ROUND_GAP_S)
    return next_sample(samples, now)


def next_sample(samples: list[Sample], now: float) -> Wait | TakeSample:
    """A round goes on: the next sample ``SAMPLE_GAP_S`` after the last one (now, if none)."""
    if samples and now < samples[-1].at + SAMPLE_GAP_S:
        return Wait(samples[-1].at + SAMPLE_GAP_S)
    return TakeSample()
