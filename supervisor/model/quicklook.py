"""The quick look (issue 51): a steady run silent a few of its own intervals, looked at a
second apart, and only while nothing moves at all may it be ended early (pure; the decider is
:func:`~dflashd.supervisor.model.hang.decide`)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Final

from dflashd.supervisor.model.threadwaits import WaitKind, waiting, waiting_on
from dflashd.supervisor.model.world import ProcessSample, waits_elsewhere

# The quick look (issue 51): a steady run silent for QUICK_FACTOR typical intervals (at least
# QUICK_SUSPECT_S) is sampled QUICK_GAP_S apart; only while every sign says nothing moves
# (see :func:`work_sign`) may its round end the run, else the long path above decides.
QUICK_SUSPECT_S: Final = 4.0
QUICK_FACTOR: Final = 4.0
QUICK_GAP_S: Final = 1.0
QUIET_CPU: Final = 0.05  # of one CPU, every process of the run together, over the look
QUIET_BYTES: Final = 4096  # read or written by any process of the run over the look
PAUSE_MARGIN: Final = 1.5  # x the longest pause the run came back from

Taken = tuple[float, Sequence[ProcessSample]]  # a sample: when, and every process of the run


def quick_after(
    intervals: tuple[float, ...], gap: float | None, longest_pause_s: float = 0.0
) -> float | None:
    """The gap after which a steady run gets its quick look (None: none before the long gap):
    a multiple of its cadence, at least :data:`QUICK_SUSPECT_S`, and half again the longest
    pause it came back from (a checkpoint or an eval that took 6 s is looked at after 9 s)."""
    if gap is None or not intervals:
        return None
    typical = statistics.median(intervals)
    quick = max(QUICK_SUSPECT_S, QUICK_FACTOR * typical, PAUSE_MARGIN * longest_pause_s)
    return quick if quick < gap else None


def work_sign(samples: Sequence[Taken], gpu_quiet: bool) -> str | None:
    """A sign of work in a quick look's samples (None: nothing moves at all): a thread that
    runs or sits in I/O, a wait whose other end is elsewhere (another node, another job), a
    wait on a GPU that is busy, CPU used, bytes read or written, a process come or gone."""
    if any(not p.stacks.threads or p.stacks.error for _, procs in samples for p in procs):
        return "a process of the run has no Python stacks"
    for _, processes in samples:
        for process in processes:
            if {"D", "R"} & set(process.thread_states) and len(samples) > 1:
                return f"pid {process.stacks.pid} has a thread running or in I/O"
            if not all(waiting(t) for t in process.stacks.threads):
                return f"pid {process.stacks.pid} runs"
    last = samples[-1][1]
    if waits_elsewhere(list(last)) is not None:
        return "it waits on work elsewhere"
    on_gpu = any(waiting_on(t) is WaitKind.GPU for p in last for t in p.stacks.threads)
    if on_gpu and not gpu_quiet:
        return "it waits on a GPU that may be busy"
    if len(samples) < 2:
        return None
    first = {p.stacks.pid: p for p in samples[0][1]}
    if set(first) != {p.stacks.pid for p in last}:
        return "the run's processes changed"
    span = max(samples[-1][0] - samples[0][0], 1e-3)
    cpu = 0.0
    for process in last:
        before = first[process.stacks.pid]
        if before.signature() != process.signature():
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
