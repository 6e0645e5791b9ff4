"""Writing the status: state.json, the metrics, systemd's ``STATUS=`` and the goodput totals,
from one snapshot.

The executor's ``Publish`` effect writes through here (its hands): the model's, the loop's
throttled write, a client's ``status`` (saved as shown: no total shown ever goes back) and
the daemon's close; each write is heard by the model as ``StatusWritten``.
"""

from __future__ import annotations

from collections.abc import Callable

from dflashd.supervisor.model.goodput import Cost, GoodputLedger
from dflashd.supervisor.speak.reporter import Reporter
from dflashd.supervisor.speak.statusview import StatusView, one_line


class Publisher:
    """The status's one writer (the snapshot and the totals are read through the callables:
    ``snapshot.status_view`` and ``snapshot.goodput_totals``)."""

    def __init__(
        self,
        reporter: Reporter,
        view: Callable[[], StatusView],
        totals: Callable[[], tuple[Cost, int | None]],
        goodput: Callable[[], tuple[GoodputLedger, float]],
        written: Callable[[], None],
    ) -> None:
        self.reporter, self.view, self.totals, self.goodput = reporter, view, totals, goodput
        self.written = written
        self.last_view: StatusView | None = None

    def publish(self, *, shown: bool = False, final: bool = False) -> str:
        """state.json, metrics and systemd's STATUS= from one snapshot, then the goodput
        totals (saved even where the status could not be written); returns its one line."""
        self.written()
        try:
            view = self.last_view = self.view()  # built once per publish
            summary = one_line(view)
            self.reporter.publish(view, summary)
        finally:
            self.save_goodput(ended=final, shown=shown)
        return summary

    def save_goodput(self, *, ended: bool, shown: bool = False) -> None:
        """The goodput totals into runs.sqlite (``ended``: the daemon's last save)."""
        totals, best = self.totals()
        ledger, now = self.goodput()
        self.reporter.save_goodput(
            ledger.first_start, totals, best_step=best, daemon_ended=ended, now=now, shown=shown
        )
