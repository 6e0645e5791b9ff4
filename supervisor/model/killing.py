"""How dflashd ends a live run it decided to end (pure): the stop's signals and its grace, a
stacks dump and then the kill, faulthandler's dump where py-spy cannot read the run, the kill
once the dump is in or past its bound.

``step`` folds :class:`~dflashd.supervisor.model.effects.StopRun` and
:class:`~dflashd.supervisor.model.effects.EndRun` into these effects and calls
:func:`after_dump` and :func:`stop_grace_over` from its arms; the shell only carries them out
(the signals through the run's custody, the dump on a thread).  No clock, no I/O.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from typing import Any, Final

from dflashd.supervisor.model.deadlines import Deadline
from dflashd.supervisor.model.effects import (
    DumpStacks,
    Effect,
    EndRunHung,
    KeepStacks,
    KillRun,
    SetTimer,
    SignalRun,
    WriteRecord,
)
from dflashd.supervisor.model.events import Event

STACKS_BOUND_S: Final = 10.0  # before a kill: the dump, or the kill goes ahead without it
DUMP_GRACE_S: Final = 3.0  # between SIGABRT (faulthandler's dump) and SIGKILL


def stop_signals(timeout_s: float, now: float) -> tuple[Effect, ...]:
    """``dflashd stop`` of a live run: SIGTERM to its group (SIGCONT, should it be stopped),
    and the grace after which :func:`stop_grace_over` decides."""
    return (
        WriteRecord(Event.STOPPING, {"signal": "SIGTERM", "timeout_s": timeout_s}),
        SignalRun("group", signal.SIGTERM),
        SignalRun("group", signal.SIGCONT),
        SetTimer(Deadline.STOP, now + timeout_s),
    )


def dump_then_kill(why: str, event: Event, no_dumps: str | None, now: float) -> tuple[Effect, ...]:
    """A run dflashd ends: py-spy's dump first (the job runs on meanwhile), the kill when it is
    in or past :data:`STACKS_BOUND_S`; ``no_dumps`` (why py-spy cannot dump): faulthandler's."""
    if no_dumps is not None:
        return faulthandler(why, event, no_dumps, now)
    fields = {"why": why, "dump": "py-spy", "then": "SIGKILL", "bound_s": STACKS_BOUND_S}
    return (
        DumpStacks(why, "", before_kill=True),
        WriteRecord(event, fields, log_level="warning"),
        SetTimer(Deadline.KILL, now + STACKS_BOUND_S),
    )


def faulthandler(why: str, event: Event, py_spy: str | None, now: float) -> tuple[Effect, ...]:
    """The fallback: faulthandler prints every thread's Python stack on SIGABRT
    (``PYTHONFAULTHANDLER=1``); SIGCONT after it, so a stopped child wakes to take it; the
    kill :data:`DUMP_GRACE_S` later."""
    fields: dict[str, Any] = {"why": why, "dump": "faulthandler", "signal": "SIGABRT"}
    fields |= {"then": "SIGKILL", "py_spy": py_spy}
    return (
        WriteRecord(event, fields, log_level="warning"),
        SignalRun("root", signal.SIGABRT),
        SignalRun("group", signal.SIGCONT),
        SetTimer(Deadline.KILL, now + DUMP_GRACE_S),
    )


def stop_grace_over(
    waiting_for: str | None, no_dumps: str | None, now: float
) -> tuple[Effect, ...]:
    """The stop's grace is over and the run lives: its stacks, then SIGKILL (``waiting_for``:
    a dump before a kill already runs: nothing more)."""
    if waiting_for is not None:
        return ()
    if no_dumps is None:
        return dump_then_kill("stop_timeout", Event.STOP_TIMEOUT, None, now)
    return (WriteRecord(Event.STOP_TIMEOUT, {"signal": "SIGKILL"}), KillRun())


def hung_kill(
    hung: EndRunHung, said: WriteRecord | None, kept: Mapping[str, Any] | None
) -> tuple[Effect, ...]:
    """A proven hang: the sample that proved it is the run's dump (``said``, its ``stacks``
    record, and what the run keeps of it; None: no sample was kept), then the kill at once,
    with no second dump."""
    ending: dict[str, Any] = {"why": "hung", "evidence": hung.why}
    ending |= {"frames": list(hung.frames), "hung_after_s": hung.hung_after_s}
    ending |= {"dump": "py-spy", "then": "SIGKILL"}
    dumped = () if said is None else (said, KeepStacks(kept or {}))
    return (*dumped, WriteRecord(Event.ENDING_RUN, ending, log_level="warning"), KillRun())


def after_dump(
    said: WriteRecord,
    kept: Mapping[str, Any],
    *,
    awaited: bool,
    alive: bool,
    ok: bool,
    trigger: str,
    error: str | None,
    now: float,
) -> tuple[Effect, ...]:
    """A dump came back (``said``: its ``stacks`` record; ``kept``: what the run keeps of it):
    one the kill waited for (``awaited``) is the run's stacks, and the kill goes ahead, or,
    where py-spy could not read the run (a seccomp profile, say), faulthandler's dump first."""
    if not awaited:
        return (said,)
    keep = KeepStacks(kept)
    if not alive:
        return (said, keep)
    if ok:
        return (said, keep, SetTimer(Deadline.KILL, None), KillRun())
    return (said, keep, *faulthandler(trigger, Event.ENDING_RUN, error, now))
