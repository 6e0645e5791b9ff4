"""``dflashd start``'s wait after the launch: the run's first step, its death, or the end
of ``start_wait_s``, whichever comes first, said in one line (a death with its verdict and
stderr tail, and the documented exit code)."""

from __future__ import annotations

import sys
import time
from contextlib import closing
from typing import Any, Final

import click

from dflashd.supervisor.host.home import Home
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.exitcodes import EXIT_FATAL, EXIT_JOB_DIED
from dflashd.supervisor.model.verdicts import Verdict
from dflashd.supervisor.speak.echo import escape_controls

_FATE_WAIT_S: Final = 2.0  # after an early exit record: time for the fatal/restart record


def wait_for_first_step(home: Home, run_no: int, wait_s: float, after_seq: int) -> int:
    """Follow the log until the run's first step, its death, or ``wait_s``; say which.

    On a terminal a one-line wait shows the seconds and the job's last line.  A death in the
    window is reported with its verdict and stderr tail, and its documented exit code.
    """
    from dflashd.logs.reader import RecordFilter, follow
    from dflashd.logs.records import EventRecord, LineRecord

    if wait_s <= 0:
        return 0
    started = time.monotonic()
    deadline = started + wait_s
    exit_fields: dict[str, Any] | None = None
    last_line = ""
    live = _LiveLine(sys.stderr.isatty())
    records = follow(
        home.logs,
        RecordFilter(run=run_no),
        after_seq=after_seq,
        poll_s=0.05,
        should_stop=lambda: live.tick(run_no, started, last_line) or time.monotonic() > deadline,
    )
    try:
        with closing(records):
            for record in records:
                if isinstance(record, LineRecord) and record.line.strip():
                    last_line = record.line
                elif not isinstance(record, EventRecord):
                    continue
                elif record.event == Event.FIRST_STEP and exit_fields is None:
                    live.clear()
                    after, source = record.fields.get("after_s"), record.fields.get("source")
                    click.echo(
                        f"dflashd: run {run_no} is training: first step after {after}s ({source})"
                    )
                    return 0
                elif record.event == Event.EXIT:
                    exit_fields = record.fields
                    deadline = time.monotonic() + _FATE_WAIT_S
                elif exit_fields is not None and record.event in (
                    Event.FATAL,
                    Event.RESTART,
                    Event.DONE,
                ):
                    live.clear()
                    return _report_early_exit(run_no, exit_fields, record.event, record.fields)
    finally:
        live.clear()
    if exit_fields is not None:
        return _report_early_exit(run_no, exit_fields, "", {})
    shown = f" (last line: {escape_controls(last_line[:160])})" if last_line else ""
    click.echo(f"dflashd: run {run_no} is running, no step seen in {wait_s:g}s{shown}")
    return 0


class _LiveLine:
    """``waiting for run 3's first step… 7s | <last line>`` on a terminal, redrawn in place."""

    def __init__(self, on: bool) -> None:
        self.on, self._drawn, self._next = on, False, 0.0

    def tick(self, run_no: int, started: float, last_line: str) -> bool:
        now = time.monotonic()
        if self.on and now >= self._next:
            self._next = now + 0.25
            text = f"waiting for run {run_no}'s first step… {now - started:.0f}s"
            if last_line:
                text += f" | {escape_controls(last_line)}"
            sys.stderr.write("\r\x1b[2K" + text[:120])
            sys.stderr.flush()
            self._drawn = True
        return False

    def clear(self) -> None:
        if self._drawn:
            sys.stderr.write("\r\x1b[2K")
            sys.stderr.flush()
            self._drawn = False


def _report_early_exit(
    run_no: int, fields: dict[str, Any], then: str, then_fields: dict[str, Any]
) -> int:
    how = (
        f"exit code {fields.get('exit_code')}"
        if fields.get("exit_code") is not None
        else str(fields.get("signal"))
    )
    ended = "ended" if fields.get("verdict") == Verdict.COMPLETED else "died"
    click.echo(
        f"dflashd: run {run_no} {ended}: {fields.get('verdict')} ({fields.get('reason')}), {how} "
        f"after {fields.get('duration_s')}s",
        err=True,
    )
    for line in (fields.get("tail") or [])[-10:]:
        click.echo(f"    | {escape_controls(str(line))}", err=True)
    if then == Event.FATAL:
        click.echo(f"dflashd: fatal: {then_fields.get('reason')}; not restarting", err=True)
        return EXIT_FATAL
    if then == Event.RESTART:
        click.echo(f"dflashd: restarting in {then_fields.get('delay_s')}s", err=True)
    if then == Event.DONE:
        return 0 if fields.get("verdict") == Verdict.COMPLETED else EXIT_JOB_DIED
    return EXIT_JOB_DIED
