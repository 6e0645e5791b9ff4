"""The ledger: what outlives a run (restart budgets, restarts by verdict, the last exit, goodput).

:func:`~dflashd.supervisor.model.ending.conclude` reads it and says how it changes (a
:class:`~dflashd.supervisor.model.effects.UpdateLedger` effect); :meth:`Ledger.took`, called by the
model's ``step`` (:mod:`~dflashd.supervisor.model.step`), gives the ledger after it.  The
status snapshot reads it.  Nothing here decides.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from dflashd.supervisor.model.effects import Incident, UpdateLedger
from dflashd.supervisor.model.goodput import GoodputLedger
from dflashd.supervisor.model.policy import RestartHistory
from dflashd.supervisor.model.verdicts import RoomHold

__all__ = ["Incident", "Ledger", "UpdateLedger", "capped_exit"]

STATE_TAIL_LINES: Final = 20
STATE_LINE_CHARS: Final = 1000  # status and state.json carry a bounded tail; the exit record all


def capped_exit(fields: dict[str, Any]) -> dict[str, Any]:
    """An exit's fields as status and state.json carry them: the tail bounded.

    A job that dies printing 64 KiB lines of control bytes would otherwise make state.json
    grow past what its reader accepts (each byte escaped to six), and a later daemon would
    lose the run's record.  The ``exit`` record in the log keeps the whole tail.
    """
    tail = fields.get("tail")
    if isinstance(tail, list):
        cut = [
            line if len(line) <= STATE_LINE_CHARS else line[:STATE_LINE_CHARS] + "…"
            for line in (str(x) for x in tail[-STATE_TAIL_LINES:])
        ]
        fields = {**fields, "tail": cut}
    return fields


@dataclass(frozen=True, slots=True)
class Ledger:
    """The counters kept between runs (and, from state.json, between daemons): a value,
    replaced by :meth:`took` (the model's ``step``)."""

    history: RestartHistory = field(default_factory=RestartHistory)
    restarts_by_verdict: Mapping[str, int] = field(default_factory=dict)
    restarts_this_daemon: int = 0
    last_exit: dict[str, Any] | None = None
    fatal_reason: str | None = None
    clear_cache_next: bool = False
    recovering_from: str | None = None
    incident: Incident | None = None
    agent_restarts: int = 0  # torchrun restarted its workers itself (this daemon's lifetime)
    agent_worker_failures: int = 0
    goodput: GoodputLedger = field(default_factory=lambda: GoodputLedger(first_start=0.0))
    diverged_at: int | None = None  # the step where a run's loss last diverged
    hold: RoomHold | None = None  # what the next relaunch waits for (a rule's)

    def took(self, book: UpdateLedger) -> Ledger:
        """The ledger after one :class:`UpdateLedger` effect."""
        changes: dict[str, Any] = {
            "agent_restarts": self.agent_restarts + book.agent_restarts,
            "agent_worker_failures": self.agent_worker_failures + book.agent_worker_failures,
        }
        if book.last_exit is not None:
            changes["last_exit"] = capped_exit(book.last_exit)
        if book.history is not None:
            changes["history"] = book.history
        if book.counted_verdict is not None:
            verdict, counts = book.counted_verdict, self.restarts_by_verdict
            changes["restarts_by_verdict"] = {**counts, verdict: counts.get(verdict, 0) + 1}
            changes["restarts_this_daemon"] = self.restarts_this_daemon + 1
        if book.clear_cache_next is not None:
            changes["clear_cache_next"] = book.clear_cache_next
        if book.fatal_reason is not None:
            changes["fatal_reason"] = book.fatal_reason
        if book.recovering_from is not None:
            changes["recovering_from"] = book.recovering_from
        if book.incident is not None:
            changes["incident"] = book.incident
        if book.recovered:
            changes["recovering_from"] = changes["incident"] = None
        if book.restarts_by_verdict is not None:
            changes["restarts_by_verdict"] = dict(book.restarts_by_verdict)
        if book.goodput is not None:
            changes["goodput"] = book.goodput
        if book.diverged_at is not None:
            changes["diverged_at"] = book.diverged_at
        if book.hold is not None:
            changes["hold"] = book.hold
        if book.hold_over:
            changes["hold"] = None
        return replace(self, **changes)
