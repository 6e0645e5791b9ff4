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

import statistics
from dataclasses import dataclass
from typing import Any, Final

from dflashd.supervisor.model.gpuspin import spinning_power, spun_s
from dflashd.supervisor.model.judge import SAMPLES, Finding, Judgement, Sample, judge
from dflashd.supervisor.model.quicklook import (
    QUICK_GAP_S,
    quick_after,
    work_sign,
)
from dflashd.supervisor.model.stacks import StacksDump
from dflashd.supervisor.model.world import (
    someone_works,
    world_decides,
    world_stuck,
)

HANG_SUSPECT_S: Final = 12.0  # the shortest gap that makes a steady run suspect
CADENCE_FACTOR: Final = 6.0  # ... or this many typical intervals, if longer
STEADY_INTERVALS: Final = 5  # intervals seen before a cadence counts as steady
# ... or this many steps over fewer intervals: steps posted at most four times a second
# (linewatch.STEP_POST_S), a job of 1 ms steps shows 150 of them in one or two posts
STEADY_STEPS: Final = 20
SAMPLE_GAP_S: Final = 3.0  # between two samples of one round
ROUND_GAP_S: Final = 15.0  # after a round that found work (or could not tell), the next one
# A wait on work elsewhere is alerted once after this long: longer than most evals and saves,
# well short of the stall window (15 min) that ends a run in which nothing moves at all.
REMOTE_WAIT_S: Final = 300.0


@dataclass(frozen=True, slots=True)
class HangSampled:
    """Inbox message: a sample of run ``run_no`` taken on a thread (its dump kept for the file)."""

    run_no: int
    sample: Sample
    dump: StacksDump


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
    steps_seen: int = 0  # the steps it advanced since its first step line


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


def suspect_after(
    intervals: tuple[float, ...], limits: HangLimits, steps_seen: int = 0
) -> float | None:
    """The gap after which a run is suspect, or None before its cadence is steady: five
    intervals seen, or twenty steps over at least one (a fast job's steps come in batches)."""
    steady = len(intervals) >= STEADY_INTERVALS or (bool(intervals) and steps_seen >= STEADY_STEPS)
    if limits.hang_suspect_s <= 0 or not steady:
        return None
    typical = statistics.median(intervals)
    return max(limits.hang_suspect_s, CADENCE_FACTOR * typical)


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
    gpu_quiet = view.gpu_idle or spinning_power(view.gpu_power_share)
    taken = [(x.at, x.processes) for x in samples]
    sign = work_sign(taken, gpu_quiet) if samples else None
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
    gap = suspect_after(view.intervals, limits, view.steps_seen)
    if gap is None or view.last_progress is None or not view.reports_steps:
        return Wait(None)
    suspect_at = view.last_progress + gap
    quick = quick_after(view.intervals, gap, view.longest_pause_s)
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
