"""A start-up that waits for ever, named before the first step (pure; issue 41).

Before its first step a run has no cadence, so nothing makes it suspect the way a gap after
steady steps does; ``first_step_timeout_s`` (an hour by default) is the only bound.  But the
stacks tell the same story as a hang: a DeepSpeed job started while a killed build had left
``torch_extensions/.../lock`` polls that lock in a sleep loop for ever; a worker waits in the
rendezvous for a node that never comes; a process waits on a file lock.

From :data:`STARTUP_LOOK_S` after the launch, a run with no first step is sampled like a suspect
one (rounds of samples, :func:`~dflashd.supervisor.model.judge.judge`).  A round whose every
thread waits, unmoved, is *named* (never ended: the first-step timeout keeps that word) when the
wait is a start-up wait dflashd knows (a build lock or file lock, the rendezvous, the process
group's set-up) or when a build lock older than the run exists: one ``waiting`` alert and
``status`` say where it waits and, for a build lock, its path, its age and what to remove.  A
job that merely sleeps in its own code before its first step is left alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from dflashd.supervisor.model.hang import Evidence, NewRound, TakeSample, Wait, next_sample
from dflashd.supervisor.model.judge import Finding, Judgement, judge

STARTUP_LOOK_S: Final = 30.0  # no first step this long after the launch: the start-up is sampled
STARTUP_ROUND_GAP_S: Final = 30.0  # between two rounds of start-up samples
# Frames of the waits a start-up is known to get stuck in: torch's build baton and file locks,
# the rendezvous (torchrun's and the process group's), flock.
_STARTUP_WAIT: Final = re.compile(
    r"file_baton|filelock|cpp_extension|rendezvous|distributed_c10d|c10d_rendezvous|"
    r"elastic/|fcntl|flock|lockf|\block\b",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class StartupStuck:
    """Name the start-up's wait (once): the judgement and the frames that show it."""

    judgement: Judgement


StartupAction = Wait | TakeSample | NewRound | StartupStuck


def known_startup_wait(frames: tuple[str, ...]) -> bool:
    """The frames hold a wait a start-up is known to get stuck in."""
    return any(_STARTUP_WAIT.search(frame) for frame in frames)


def startup_decide(
    started: float,
    stacks_available: bool,
    sampling: bool,
    evidence: Evidence,
    now: float,
    *,
    stale_lock: bool,
) -> StartupAction:
    """What to do about a run that has not made its first step, now.

    ``stale_lock``: a build lock older than the run exists where torch builds this run's
    extensions (host/caches.py); then any unmoved wait is named, with the lock.
    """
    look_at = started + STARTUP_LOOK_S
    if now < look_at:
        return Wait(look_at)
    if not stacks_available or sampling:
        return Wait(None)
    if evidence.next_round_at is not None and now < evidence.next_round_at:
        return Wait(evidence.next_round_at)
    samples = list(evidence.samples)
    if samples:
        verdict = judge(samples)
        if verdict.finding in (Finding.HUNG, Finding.ELSEWHERE):
            if stale_lock or known_startup_wait(verdict.frames):
                return StartupStuck(verdict)
            return NewRound(verdict, now + STARTUP_ROUND_GAP_S)
        if verdict.finding in (Finding.WORKING, Finding.UNKNOWN):
            return NewRound(verdict, now + STARTUP_ROUND_GAP_S)
    return next_sample(samples, now)
