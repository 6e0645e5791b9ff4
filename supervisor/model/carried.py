"""Start-up, before the first launch: what a new daemon carries over from the last one (pure).

The shell reads what the last daemon left (state.json, runs.sqlite's goodput row, the run log's
unsaved tail), ends what of its run still lives once proven ours, and hands it all to the
model as one :class:`~dflashd.supervisor.model.inputs.CarriedOver`; :func:`restore` says what
that carries: the ledger's counters and the records, in order.  Then, as the daemon opens
(:class:`~dflashd.supervisor.model.inputs.Started`), :func:`opened` says what comes before the
first launch: the record of GPU checks that are off, systemd's watchdog fed from now.
"""

from __future__ import annotations

from dataclasses import dataclass

from dflashd.supervisor.model.deadlines import Deadline
from dflashd.supervisor.model.effects import Effect, SetTimer, UpdateLedger, WriteRecord
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.goodput import restored_ledger
from dflashd.supervisor.model.inputs import CarriedOver, Started
from dflashd.supervisor.model.lifecycle import State
from dflashd.supervisor.model.runstate import RunFacts


@dataclass(frozen=True, slots=True)
class Restored:
    """What start-up carries over: the ledger's counters and the records (effects, in order),
    and the facts of a run the dead daemon never saw end (concluded as ``lost``)."""

    effects: tuple[Effect, ...]
    lost: RunFacts | None


def restore(heard: CarriedOver, now_mono: float) -> Restored:
    """Start-up, before the first launch (pure): the counters from state.json and the goodput
    ledger from runs.sqlite carried over, the records of what a dead daemon left
    (``leftovers``, ended by the host's recovery, proven ours) and of a torn log tail; ``lost``:
    the facts of a run the dead daemon never saw end (its open slow incident closed here)."""
    previous, lost, logged = heard.previous, heard.lost, heard.logged
    saved_goodput, now_wall = heard.saved_goodput, heard.now_wall
    goodput = restored_ledger(saved_goodput, now_wall=now_wall, now_mono=now_mono, logged=logged)
    fatal = previous.get("state") == State.FATAL  # a run that reaches its first step: ``recovered``
    book = UpdateLedger(
        restarts_by_verdict=dict(previous.get("restarts_by_verdict") or {}),
        goodput=goodput,
        recovering_from="fatal" if fatal else None,
    )
    effects: list[Effect] = [book]
    if (absent := goodput.absent).total_s > 0:  # no daemon was here: said so
        effects.append(WriteRecord(Event.GOODPUT_CARRIED, dict(absent.record()), run_no=0))
    effects.extend(heard.leftovers)
    if heard.torn_bytes:
        torn = {"bytes": heard.torn_bytes}
        effects.append(WriteRecord(Event.LOG_TORN_TAIL, torn, run_no=heard.last_run))
    slow = previous.get("slow")
    if lost is not None and isinstance(slow, dict):
        # the dead daemon's open slow incident ends with its run: closed once, here (no
        # `recovered` alert: nothing came back), never reopened or counted again
        fields = {"closed": "the run was lost with the daemon that watched it"}
        fields |= {k: slow[k] for k in ("ratio", "step", "since") if k in slow}
        effects.append(WriteRecord(Event.SLOW_OVER, fields, run_no=lost.run_no))
    return Restored(tuple(effects), lost)


def opened(heard: Started, now: float) -> tuple[Effect, ...]:
    """The daemon opens: why its GPU checks are off (a record), the watchdog's first feed."""
    said: list[Effect] = []
    if heard.gpu_checks_off is not None:
        fields = {"reason": heard.gpu_checks_off}
        said.append(WriteRecord(Event.GPU_CHECKS_OFF, fields, run_no=0))
    if heard.watchdog:
        said.append(SetTimer(Deadline.WATCHDOG, now))
    return tuple(said)
