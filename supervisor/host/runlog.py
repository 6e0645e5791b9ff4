"""The run log read back at start-up: what a daemon killed with its run had not saved.

The goodput ledger is saved every few seconds and whenever status shows it; a daemon killed
between two saves left the rest only in the run log (its ``first_step`` and ``progress``
records and the job's own step lines).  This reads it for :func:`~dflashd.supervisor.model.carried.restore`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dflashd.supervisor.host.recovery import previous_child
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.goodput import LoggedRun, cost_from_json


def unsaved_progress(
    saved: tuple[float, Any, bool] | None, previous: dict[str, Any], logs: Path
) -> LoggedRun | None:
    """After a daemon that died with its run: what the log holds of that run past the
    goodput ledger's last save (``saved``: runs.sqlite's row), else None."""
    lost = previous_child(previous)
    if saved is None or saved[2] or lost is None:
        return None
    settled_until = saved[0] + cost_from_json(saved[1]).total_s
    return logged_progress(logs, lost.run_no, settled_until)


def logged_progress(logs: Path, run_no: int, since_wall: float) -> LoggedRun | None:
    """What the run log holds of run ``run_no`` after ``since_wall``: its first step and its
    last progress (a ``first_step`` or ``progress`` record, or a line a built-in format reads
    as a step).  What a daemon killed with its run had not saved; None when unreadable."""
    from dflashd.logs.reader import RecordFilter, read_records
    from dflashd.logs.records import EventRecord, LineRecord, parse_timestamp, utc_timestamp
    from dflashd.supervisor.model.formats import match_line

    first: float | None = None
    last: float | None = None
    keep = RecordFilter(run=run_no, since_ts=utc_timestamp(max(0.0, since_wall - 1.0)))
    try:
        for rec in read_records(logs, keep):
            at = parse_timestamp(rec.ts)
            if isinstance(rec, EventRecord):
                if rec.event == Event.FIRST_STEP:
                    first = at if first is None else first
                elif rec.event != Event.PROGRESS:
                    continue
            elif (
                not isinstance(rec, LineRecord)
                or rec.partial
                or (found := match_line(rec.line)) is None
                or found.step is None
            ):
                continue
            last = at if last is None else max(last, at)
    except (OSError, ValueError):
        return None
    return LoggedRun(first, last) if last is not None else None
