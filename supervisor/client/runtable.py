"""The report's one table of runs: how each ended, when, what it cost, what it ran, its error.

One row per run, its verdict in the verdict's colour (the timeline's and the lines'), its
start with the year, its duration in status' form, and the goodput ledger's buckets from its
``exit`` record; under it, the command it ran and, for a failure, its last output line.
"""

from __future__ import annotations

import html
import time

from dflashd.supervisor.client.goodputhtml import seconds_cell
from dflashd.supervisor.client.reportdata import (
    ReportData,
    RunSpan,
    diverged_text,
    verdict_color,
)
from dflashd.supervisor.model.goodput import duration_text

_HEAD = (
    "run",
    "verdict",
    "reason",
    "started (UTC)",
    "duration",
    "first step after (start)",
    "last step",
    "startup",
    "redone",
    "slow",
    "detection",
    "downtime after",
    "productive",
)


def started_text(epoch_s: float) -> str:
    """``2026-12-02 15:22:29``: the date with its year, in UTC as the axes are."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(epoch_s))


def seconds_text(seconds: float) -> str:
    """A duration as status and the goodput ledger say it: ``7m02s``; under 10 s, ``3.2s``;
    under one, ``0.02s``."""
    if seconds >= 10:
        return duration_text(seconds)
    return f"{seconds:.1f}s" if seconds >= 1 else f"{seconds:.2f}s"


def _cost_cells(data: ReportData, run: int) -> str:
    incident = data.goodput.incidents.get(run)
    if incident is None:
        return "<td class='num'>-</td>" * 6
    cost = data.goodput.cost_of(incident)
    cells = [
        seconds_cell(c)
        for c in (
            cost.startup_s,
            cost.redone_s,
            cost.slow_s,
            cost.detection_s,
            incident.downtime_after_s,
            cost.productive_s,
        )
    ]
    redone = data.redone_steps(run)
    if redone and cost.redone_s > 0:  # a relaunch's redone seconds, with the steps they were
        cells[1] += f" ({redone} step{'s' if redone != 1 else ''})"
    return "".join(f"<td class='num'>{c}</td>" for c in cells)


def _detail_row(span: RunSpan, previous: RunSpan | None) -> str:
    """The command (said again only where it changed from the run before) and the error."""
    lines = []
    if span.argv and (previous is None or previous.command != span.command):
        where = f" <span class='note'>in {html.escape(span.cwd)}</span>" if span.cwd else ""
        lines.append(f"<code>$ {html.escape(span.command)}</code>{where}")
    elif span.argv:
        lines.append("<span class='note'>the same command</span>")
    if span.error:
        lines.append(f"<code class='error'>{html.escape(span.error)}</code>")
    if not lines:
        return ""
    return (
        f"<tr class='detail'><td></td><td colspan='{len(_HEAD) - 1}'>{'<br>'.join(lines)}</td></tr>"
    )


def _diverged_note(data: ReportData, run: int) -> str:
    """A run whose loss diverged says so in its row, whatever it ended as."""
    marks = [diverged_text(step, good) for _, r, step, good in data.diverged if r == run]
    if not marks:
        return ""
    color = verdict_color("diverged")
    return f"<br><b style='color:{color}'>{html.escape(marks[0])}</b>"


def run_table(data: ReportData) -> str:
    """Every run, once: verdict, times, costs, command and error."""
    rows = []
    previous: RunSpan | None = None
    for span in sorted(data.runs.values(), key=lambda r: r.run):
        verdict = data.verdict_of(span)
        lasted = span.end - span.start if span.end else None
        duration = verdict if lasted is None else seconds_text(lasted)
        first = seconds_text(span.first_step_at - span.start) if span.first_step_at else "-"
        if span.start_kind:  # warm: it ran in the standby interpreter (warm_standby)
            first += f" {html.escape(span.start_kind)}"
        step = "" if span.last_step is None else str(span.last_step)
        shade = verdict_color(verdict)
        rows.append(
            f"<tr><td><span style='color:{shade}'>&#9632;</span> {span.run}</td>"
            f"<td style='color:{shade}'><b>{html.escape(verdict)}</b></td>"
            f"<td>{html.escape(span.reason)}{_diverged_note(data, span.run)}</td>"
            f"<td>{started_text(span.start)}</td>"
            f"<td class='num'>{duration}</td><td class='num'>{first}</td>"
            f"<td class='num'>{step}</td>{_cost_cells(data, span.run)}</tr>"
        )
        rows.append(_detail_row(span, previous))
        previous = span
    head = "".join(f"<th>{name}</th>" for name in _HEAD)
    return f"<table class='runs'><tr>{head}</tr>\n{''.join(rows)}</table>"
