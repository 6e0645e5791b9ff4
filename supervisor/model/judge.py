"""A round of samples read: hung, working, waiting elsewhere, or unknown (pure; the decider that
asks is :func:`~dflashd.supervisor.model.hang.decide`, docs/design.md "Hangs")."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from enum import Enum
from typing import Final

from dflashd.supervisor.model.gpuspin import gpu_wait
from dflashd.supervisor.model.threadwaits import WaitKind, waiting, waiting_on
from dflashd.supervisor.model.world import ProcessSample, WorldHeard, waits_elsewhere

SAMPLES: Final = 3  # samples that must agree before a run is hung


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
            if pid in earlier and earlier[pid].signature() != process.signature():
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
        found = gpu_wait(digests[0], digests[1], tuple(p.signature() for p in last.values()))
        if found.key is None:
            return Judgement(Finding.WORKING, found.why)
        return Judgement(Finding.GPU_WAIT, found.why, _frames(last), found.key)
    frames = _frames(last)
    span = samples[-1].at - samples[0].at
    # a wait whose other end is elsewhere, seen in any sample of the round: its wait channel
    # is read at one instant, and a thread woken a moment (a chunk of a slow stream arriving,
    # a loaded CPU late to run it) shows none; its evidence in the other samples still holds
    elsewhere = next(
        (said for one in reversed(judged) if (said := waits_elsewhere(list(one.values())))),
        None,
    )
    if elsewhere is not None:
        return Judgement(Finding.ELSEWHERE, elsewhere, frames)
    return Judgement(Finding.HUNG, f"every thread waits, unmoved for {span:.0f}s", frames)
