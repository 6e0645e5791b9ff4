"""The log writer's drop ledger: what was lost, and what the next ``log_dropped`` record is to say."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Drops:
    """What the writer lost (all of it: its stats) and what is still to be said (the next
    ``log_dropped`` record's counts, and an upstream drop's cause: the sink's)."""

    records: int = 0
    nbytes: int = 0
    unreported_records: int = 0
    unreported_bytes: int = 0
    error: str | None = None

    def lost(self, records: int, nbytes: int) -> None:
        """Lost here: in the stats, and in the next record."""
        self.records, self.nbytes = self.records + records, self.nbytes + nbytes
        self.noted(records, nbytes, self.error)

    def noted(self, records: int, nbytes: int, error: str | None) -> None:
        """To be said by the next record (lost upstream: counted in the sink's stats)."""
        self.unreported_records += records
        self.unreported_bytes += nbytes
        self.error = error
