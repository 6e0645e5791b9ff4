"""A dead run's leftovers before its relaunch (pure): nothing of it lives into the next run.

What the dead run's custody proves its own (its cgroup's processes, or its pidfd-proven
members) is named once and sent SIGTERM (and SIGCONT, should it be stopped), a stateless one
(a compile worker) SIGKILL at once; SIGKILL to all of it after :data:`LEFTOVER_GRACE_S`; still
there :data:`LEFTOVER_GIVE_UP_S` after the first look (stuck in the kernel, say): said, and the
relaunch goes ahead.  A thread watches for the run to empty meanwhile, so the relaunch follows
the last leftover at once.  ``step``'s ``ReleaseLooked`` arm calls :func:`leftovers_step`; the
shell only reads which processes are left.  No clock, no I/O.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Final

from dflashd.supervisor.model.deadlines import Deadline
from dflashd.supervisor.model.effects import (
    Effect,
    KillHolders,
    KillRun,
    SetTimer,
    SignalLeftovers,
    WatchEmpty,
    WriteRecord,
)
from dflashd.supervisor.model.events import Event

LEFTOVER_GRACE_S: Final = 3.0  # a dead run's leftovers: between SIGTERM and SIGKILL
LEFTOVER_POLL_S: Final = 0.1
LEFTOVER_GIVE_UP_S: Final = 10.0  # SIGKILLed 7 s ago and still there: relaunch anyway
# Leftovers that hold no state of the job's, so no grace: SIGKILL at once.  Inductor's compile
# workers outlive a SIGKILLed trainer; one slow to go on SIGTERM would hold the relaunch for the
# whole grace.
STATELESS_LEFTOVERS: Final = ("torch/_inductor/compile_worker/",)


def stateless(cmdline: str) -> bool:
    """A leftover that holds nothing of the job's (a compile worker): it needs no grace."""
    return any(marker in cmdline for marker in STATELESS_LEFTOVERS)


@dataclass(frozen=True, slots=True)
class Leftovers:
    """What the dead run ``run_no`` left running, as its custody (``by``) proves it: each
    process's pid and command line."""

    run_no: int
    named: tuple[tuple[int, str], ...]
    by: str


def leftovers_step(
    since: float | None, left: Leftovers, now: float
) -> tuple[float | None, tuple[Effect, ...], bool]:
    """What a look that found ``left`` does (``since``: when they were first found): the next
    ``since``, the effects, and whether the relaunch goes ahead anyway (given up)."""
    pids = [pid for pid, _ in left.named]
    if since is None:
        at_once = [pid for pid, cmdline in left.named if stateless(cmdline)]
        fields = {
            "pids": {str(pid): cmdline for pid, cmdline in left.named},
            "signal": "SIGTERM",
            "sigkill_at_once": at_once,
            "by": left.by,
        }
        return (
            now,
            (
                WriteRecord(Event.ENDING_LEFTOVERS, fields, "warning", run_no=left.run_no),
                KillHolders(tuple(at_once)),
                SignalLeftovers(signal.SIGTERM),
                SignalLeftovers(signal.SIGCONT),
                WatchEmpty(),  # the relaunch follows the last one at once, not a poll
                SetTimer(Deadline.RELEASE_CHECK, now + LEFTOVER_GRACE_S),
            ),
            False,
        )
    if now - since >= LEFTOVER_GIVE_UP_S:  # unkillable: said, and the relaunch goes ahead
        said = WriteRecord(Event.LEFTOVER_PROCESSES, {"pids": sorted(pids)}, run_no=left.run_no)
        return None, (said,), True
    if now - since >= LEFTOVER_GRACE_S:
        return (
            since,
            (KillRun(), SetTimer(Deadline.RELEASE_CHECK, since + LEFTOVER_GIVE_UP_S)),
            False,
        )
    return since, (SetTimer(Deadline.RELEASE_CHECK, now + LEFTOVER_POLL_S),), False
