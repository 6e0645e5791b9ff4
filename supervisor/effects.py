"""What the daemon's decisions ask for: records, alerts, the history row, the ledger, the
processes, the state, the timers, the exit code, as plain values.

A pure decision (:func:`~dflashd.supervisor.ending.conclude`,
:func:`~dflashd.supervisor.incidents.resumed`) returns a tuple of these, in order;
:meth:`~dflashd.supervisor.runend.RunEnds.apply` is the one applier that carries them out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dflashd.supervisor.events import Event
from dflashd.supervisor.goodput import Cost
from dflashd.supervisor.history import RunHistory
from dflashd.supervisor.ledger import Book
from dflashd.supervisor.lifecycle import State
from dflashd.supervisor.verdicts import AlertKind


@dataclass(frozen=True, slots=True)
class WriteRecord:
    """One ``dflashd`` record; ``log_level``: also dflashd's own log; ``wait_s``: onto disk."""

    event: Event
    fields: dict[str, Any]
    log_level: str | None = None
    wait_s: float | None = None


@dataclass(frozen=True, slots=True)
class SendAlert:
    """One alert; ``fields``: the exit's (code, signal, duration, tail) for the payload."""

    kind: AlertKind
    reason: str
    fields: dict[str, Any]


@dataclass(frozen=True, slots=True)
class RecordHistory:
    """The run's row in runs.sqlite."""

    run_no: int
    ended_at: float
    row: dict[str, Any]

    def write(self, db: RunHistory) -> None:
        """Write the row (the reporter calls this, degrading on a full disk)."""
        db.ended(self.run_no, ended_at=self.ended_at, **self.row)


@dataclass(frozen=True, slots=True)
class SettleProcesses:
    """What becomes of the dead run's processes: killed now (dflashd ended it), or noted
    as leftovers and ended before the next launch."""

    kill_now: bool


@dataclass(frozen=True, slots=True)
class EnterState:
    """The loop's next state."""

    state: State


@dataclass(frozen=True, slots=True)
class RestartIn:
    """The next launch, after ``delay_s``."""

    delay_s: float


@dataclass(frozen=True, slots=True)
class ExitDaemon:
    """The daemon ends with ``code`` (done, stopped, fatal)."""

    code: int


@dataclass(frozen=True, slots=True)
class Account:
    """The run's cost into the goodput ledger; the gap after ``died_mono`` is downtime when
    a relaunch follows, stopped time when none does."""

    cost: Cost
    died_mono: float
    relaunch: bool


Effect = (
    WriteRecord
    | SendAlert
    | RecordHistory
    | Book
    | Account
    | SettleProcesses
    | EnterState
    | RestartIn
    | ExitDaemon
)
