"""The report's goodput section: where the time went, rebuilt from the run log alone.

Each ``exit`` record carries its run's ``cost`` (startup, redone, productive, detection,
stopped seconds), each ``spawn`` the ``downtime_s`` before it, and a daemon's start the time
no daemon was here (``goodput_carried``).  Their sums are the ledger; their order in time is
the timeline: a run's start-up, then its redone steps, its new progress, its detection.
Pure functions of the records; inline SVG, no script.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any, Final

from dflashd.supervisor.client.svgaxis import LEFT as _LEFT
from dflashd.supervisor.client.svgaxis import RIGHT as _RIGHT
from dflashd.supervisor.client.svgaxis import WIDTH as _W
from dflashd.supervisor.client.svgaxis import axis_svg, x_of
from dflashd.supervisor.model.advice import AdviceInputs, checkpoint_cost, said
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.goodput import (
    Cost,
    RunTimes,
    cost_from_json,
    duration_text,
    run_cost,
)

# productive first, then the causes as status names them, stopped last
BUCKETS: Final = (
    # pale tints, none a verdict's colour (reportdata.VERDICT_COLORS): a bar's red is never
    # read as "crashed", nor its orange as "stalled"
    ("productive", "productive_s", "#81c784"),
    ("startup", "startup_s", "#ffe082"),
    ("redone", "redone_s", "#ffcc80"),
    ("slow", "slow_s", "#80deea"),
    ("detection", "detection_s", "#ef9a9a"),
    ("downtime", "downtime_s", "#ce93d8"),
    ("stopped", "stopped_s", "#e0e0e0"),
)
_IN_RUN: Final = ("startup_s", "redone_s", "slow_s", "productive_s", "detection_s", "stopped_s")


@dataclass
class RunCostRow:
    """One run's end and what it cost."""

    run: int
    started: float
    ended: float | None = None
    verdict: str = "running"
    reason: str = ""
    cost: Cost = field(default_factory=Cost)
    downtime_before_s: float = 0.0
    downtime_after_s: float | None = None  # the next spawn's, once it came
    # what a run still alive (no exit record yet) is settled from, as status settles it
    first_step_at: float | None = None
    last_progress_at: float | None = None
    last_seen_at: float = 0.0
    best_before: int | None = None  # the best step of the runs before it
    best_step: int | None = None
    passed_best_at: float | None = None

    def saw_step(self, step: object, at: float) -> None:
        """A step this run reported (first step or progress) at ``at``."""
        self.last_progress_at = at
        if not isinstance(step, int) or isinstance(step, bool):
            return
        if self.best_step is None or step > self.best_step:
            self.best_step = step
        if self.passed_best_at is None and self.best_before is not None and step > self.best_before:
            self.passed_best_at = at

    def live_cost(self, now: float | None) -> Cost:
        """A run with no exit record yet, settled up to ``now`` (None: up to its last record)."""
        times = RunTimes(
            launched=self.started,
            first_step=self.first_step_at,
            last_progress=self.last_progress_at,
            best_before=self.best_before,
            passed_best=self.passed_best_at,
            stepped=self.best_step is not None,
        )
        return run_cost(times, max(now or self.last_seen_at, self.last_seen_at), ended=False)


@dataclass
class GoodputData:
    """What the section needs, folded from the records."""

    incidents: dict[int, RunCostRow] = field(default_factory=dict)
    absent: list[tuple[float, Cost]] = field(default_factory=list)  # (daemon start, its gap)
    # The daemon is alive now: the newest run without an exit record is live, counted up to
    # this wall time (as status counts it).  None: the log's own end.
    live_until: float | None = None
    pauses: list[float] = field(default_factory=list)  # each run's checkpoint pause (exit)

    def take(self, event: str, run: int, at: float, fields: dict[str, Any]) -> None:
        """One supervisor record."""
        incident = self.incidents.get(run)
        if incident is not None:
            incident.last_seen_at = max(incident.last_seen_at, at)
        if event == Event.SPAWN:
            down = fields.get("downtime_s")
            before = float(down) if isinstance(down, int | float) and down >= 0 else 0.0
            for earlier in self.incidents.values():
                if earlier.ended is not None and earlier.downtime_after_s is None:
                    earlier.downtime_after_s = before
            bests = [i.best_step for i in self.incidents.values() if i.best_step is not None]
            self.incidents[run] = RunCostRow(
                run,
                at,
                downtime_before_s=before,
                last_seen_at=at,
                best_before=max(bests) if bests else None,
            )
        elif event == Event.FIRST_STEP and incident is not None:
            incident.first_step_at = at
            incident.saw_step(fields.get("step"), at)
        elif event == Event.PROGRESS and incident is not None and incident.ended is None:
            incident.saw_step(fields.get("step"), at)
        elif event == Event.EXIT and run in self.incidents:
            incident = self.incidents[run]
            incident.ended, incident.cost = at, cost_from_json(fields.get("cost"))
            incident.verdict = str(fields.get("verdict"))
            incident.reason = str(fields.get("reason"))
            pause = fields.get("checkpoint_pause_s")
            if isinstance(pause, int | float) and 0 < pause < 1e7:
                self.pauses.append(float(pause))
        elif event == Event.GOODPUT_CARRIED:
            self.absent.append((at, cost_from_json(fields)))

    def cost_of(self, incident: RunCostRow) -> Cost:
        """A run's cost: its exit record's, or for the run still alive, settled up to now."""
        if incident.ended is not None:
            return incident.cost
        newest = max(self.incidents)
        return incident.live_cost(self.live_until if incident.run == newest else None)

    @property
    def total(self) -> Cost:
        """The ledger as the log tells it, a live run settled up to ``live_until``."""
        out = Cost()
        for incident in self.incidents.values():
            out = out + self.cost_of(incident) + Cost(downtime_s=incident.downtime_before_s)
        for _, gap in self.absent:
            out = out + gap
        return out


def segments(data: GoodputData) -> list[tuple[float, float, str]]:
    """(start, end, bucket) in time order: each run's buckets as they came, the gaps between."""
    out: list[tuple[float, float, str]] = []
    for at, gap in data.absent:
        for name, key, _ in BUCKETS:
            if getattr(gap, key) > 0:
                out.append((at - getattr(gap, key), at, name))
    for incident in sorted(data.incidents.values(), key=lambda i: i.started):
        if incident.downtime_before_s > 0:
            out.append(
                (incident.started - incident.downtime_before_s, incident.started, "downtime")
            )
        t = incident.started
        cost = data.cost_of(incident)
        for key in _IN_RUN:
            seconds = getattr(cost, key)
            if seconds > 0:
                out.append((t, t + seconds, key.removesuffix("_s")))
                t += seconds
    return sorted(out)


def _color(name: str) -> str:
    return next(c for n, _, c in BUCKETS if n == name)


def _share_bar(total: Cost) -> str:
    """One bar: each bucket's share of the working time (the headline's denominator),
    labelled with its time and share; the time stopped on purpose is said beside it."""
    working = total.total_s - total.stopped_s
    whole = working if working > 0 else 1.0
    parts = [""]  # the opening tag, once the legend's rows are known
    x = float(_LEFT)
    span = _W - _LEFT - _RIGHT
    shown = [(n, k, c) for n, k, c in BUCKETS if k != "stopped_s"]
    for name, key, color in shown:
        seconds = getattr(total, key)
        if seconds <= 0:
            continue
        width = max(1.0, seconds / whole * span)
        title = html.escape(f"{name}: {duration_text(seconds)} ({seconds / whole:.1%})")
        parts.append(
            f'<rect x="{x:.1f}" y="4" width="{width:.1f}" height="22" fill="{color}"><title>{title}</title></rect>'
        )
        x += width
    legend, row = float(_LEFT), 0
    for name, key, color in BUCKETS:
        seconds = getattr(total, key)
        if seconds <= 0 and key != "productive_s":
            continue  # a cause that cost nothing is not in the legend
        if key == "stopped_s":
            label = f"stopped {duration_text(seconds)} (not counted)"
        else:
            label = f"{name} {duration_text(seconds)} ({seconds / whole:.1%})"
        width = 24 + 6 * len(label)
        if legend + width > _W - _RIGHT and legend > _LEFT:  # the next row
            legend, row = float(_LEFT), row + 1
        y = 38 + 16 * row
        parts.append(
            f'<rect x="{legend:.1f}" y="{y}" width="10" height="10" fill="{color}"/>'
            f'<text x="{legend + 14:.1f}" y="{y + 9}" font-size="11" fill="#333">{html.escape(label)}</text>'
        )
        legend += width
    parts.append('<text x="4" y="20" font-size="11" fill="#333">share</text></svg>')
    height = 64 + 16 * row
    parts[0] = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{height}" '
        f'viewBox="0 0 {_W} {height}" font-family="sans-serif">'
    )
    return "".join(parts)


def _timeline(data: GoodputData, lo: float, hi: float) -> str:
    """The buckets over time, on the report's time axis."""
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="56" viewBox="0 0 {_W} 56" font-family="sans-serif">'
    ]
    parts.append('<text x="4" y="20" font-size="11" fill="#333">time</text>')
    for start, end, name in segments(data):
        x0, x1 = x_of(max(start, lo), lo, hi), x_of(min(end, hi), lo, hi)
        title = html.escape(f"{name}: {duration_text(end - start)}")
        parts.append(
            f'<rect x="{x0:.1f}" y="4" width="{max(0.8, x1 - x0):.1f}" height="22" '
            f'fill="{_color(name)}"><title>{title}</title></rect>'
        )
    parts.append(axis_svg(lo, hi, 30))
    parts.append("</svg>")
    return "".join(parts)


def seconds_cell(value: float | None) -> str:
    """A table cell: ``-`` for nothing, ``0.42s`` below a second, else ``7m02s``."""
    if value is None or value <= 0.0005:
        return "-"
    return duration_text(value) if value >= 10 else f"{value:.2f}s"


def goodput_ratio(total: Cost) -> str:
    """Productive time over working time (stopped time is not counted), as status says it."""
    working = total.total_s - total.stopped_s
    return f"{total.productive_s / working:.1%}" if working > 0 else "—"


def goodput_section(data: GoodputData, lo: float, hi: float) -> str:
    """The section: the ratio, the share bar (the same ratio), the timeline, the advice; the
    runs' own costs are columns of the report's one run table (``runtable``)."""
    total = data.total
    if total.total_s <= 0:
        return ""
    working = total.total_s - total.stopped_s
    return f"""<h3>Goodput: {goodput_ratio(total)} of {duration_text(working)} went into new progress</h3>
<p class='note'>From the run log: each run's cost is in its <code>exit</code> record, the wait
before each launch in its <code>spawn</code>.  A run still alive is settled up to the report's
time from its first step and progress records, as <code>dflashd status</code> settles it.
Time stopped on purpose is not counted.</p>
<div>{_share_bar(total)}</div>
<div>{_timeline(data, lo, hi)}</div>
{_advice(data, total)}"""


def _advice(data: GoodputData, total: Cost) -> str:
    """The checkpoint interval that pays, from the log's ledger (model/advice.py)."""
    ended = [i for i in data.incidents.values() if i.ended is not None]
    failures = [i for i in ended if i.verdict not in ("completed", "stopped")]
    given = AdviceInputs(
        failures=len(failures),
        working_s=total.total_s - total.stopped_s,
        recovery_s=total.startup_s + total.detection_s + total.downtime_s,
        redone_s=total.redone_s,
        checkpoint_cost_s=checkpoint_cost(data.pauses),
    )
    advice = said(given)
    if advice is None:
        return ""
    inputs = ", ".join(f"{k} {v}" for k, v in advice["inputs"].items())
    return (
        f"<p class='advice'><b>{html.escape(advice['text'])}</b><br>"
        f"<span class='note'>Young/Daly, from the ledger: {html.escape(inputs)}</span></p>\n"
    )
