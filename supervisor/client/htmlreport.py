"""``dflashd report``: one self-contained HTML page (inline SVG, no dependencies) from the run log.

Three charts share one time axis: each run's span in its own colour, labelled with its verdict, the step over time
(from ``first_step``, ``progress`` and ``exit`` records), and each GPU's memory from the ``gpu``
records.  Everything is computed from the log by pure functions; nothing runs in the daemon.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from dflashd.logs.records import EventRecord, Record, parse_timestamp
from dflashd.supervisor.client.goodputhtml import GoodputData, goodput_section
from dflashd.supervisor.client.svgaxis import LEFT, axis_svg, x_of
from dflashd.supervisor.client.svgaxis import WIDTH as _W
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.goodput import duration_text
from dflashd.supervisor.model.lifecycle import State
from dflashd.supervisor.model.verdicts import Verdict

# One colour per verdict, used by the table, the timeline and the step and loss lines alike.
VERDICT_COLORS: Final[dict[str, str]] = {
    Verdict.COMPLETED: "#2e7d32",
    Verdict.STOPPED: "#757575",
    Verdict.CRASHED: "#c62828",
    Verdict.STALLED: "#ef6c00",
    Verdict.RENDEZVOUS_TIMEOUT: "#f9a825",
    Verdict.CRASH_BEFORE_FIRST_STEP: "#ad1457",
    Verdict.SILENT_DEATH: "#6a1b9a",
    Verdict.NO_GPU_MEMORY: "#283593",
    Verdict.SPAWN_FAILED: "#000000",
    Verdict.LOST: "#8d6e63",
    Verdict.DIVERGED: "#4e342e",
    State.RUNNING: "#1565c0",  # a run still running has no verdict yet
}
_OTHER_COLOR: Final = "#424242"
# One colour per run (cycled): distinct hues that read on white, for bars, lines and legends.
RUN_PALETTE: Final = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#9467bd",
    "#ff7f0e",
    "#17becf",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
)
_GPU_PALETTE: Final = ("#1565c0", "#00838f", "#6a1b9a", "#ef6c00", "#5d4037", "#37474f")
_LEFT: Final = LEFT


@dataclass
class RunSpan:
    """One run: when it started and ended, how, and its step at the end."""

    run: int
    start: float
    end: float | None = None
    verdict: str = "running"
    reason: str = ""
    first_step_at: float | None = None
    last_step: int | None = None


@dataclass
class ReportData:
    """What the charts need."""

    runs: dict[int, RunSpan] = field(default_factory=dict)
    steps: list[tuple[float, int, int]] = field(default_factory=list)  # (time, run, step)
    gpu_memory: dict[int, list[tuple[float, float]]] = field(
        default_factory=dict
    )  # gpu -> (time, MiB)
    gpu_total: dict[int, float] = field(default_factory=dict)
    fatal: list[tuple[float, int, str]] = field(default_factory=list)  # (time, run, reason)
    losses: list[tuple[float, int, float]] = field(default_factory=list)  # (time, run, loss)
    dumps: list[tuple[float, int, str, str]] = field(default_factory=list)  # (time, run, why, file)
    goodput: GoodputData = field(default_factory=GoodputData)

    def color(self, run: int) -> str:
        """A run's colour, the same in every chart: runs apart at a glance (its verdict is
        the bar's label and the table's coloured word)."""
        return RUN_PALETTE[(run - 1) % len(RUN_PALETTE)]

    @staticmethod
    def verdict_color(verdict: str) -> str:
        """A verdict's colour (the table's verdict column)."""
        return VERDICT_COLORS.get(verdict, _OTHER_COLOR)

    @property
    def span(self) -> tuple[float, float]:
        times = [r.start for r in self.runs.values()] + [r.end for r in self.runs.values() if r.end]
        times += [t for t, _, _ in self.steps] + [
            t for pts in self.gpu_memory.values() for t, _ in pts
        ]
        if not times:
            return 0.0, 1.0
        lo, hi = min(times), max(times)
        return lo, hi if hi > lo else lo + 1.0


def collect(records: Iterable[Record], only_runs: set[int] | None = None) -> ReportData:
    """Fold supervisor records into report data (child lines are ignored)."""
    data = ReportData()
    for rec in records:
        if not isinstance(rec, EventRecord) or (only_runs is not None and rec.run not in only_runs):
            continue
        at = parse_timestamp(rec.ts)
        fields = rec.fields
        data.goodput.take(rec.event, rec.run, at, fields)
        if rec.event == Event.SPAWN:
            data.runs[rec.run] = RunSpan(rec.run, at)
        elif rec.event == Event.FIRST_STEP and rec.run in data.runs:
            data.runs[rec.run].first_step_at = at
            if isinstance(fields.get("step"), int):
                data.steps.append((at, rec.run, fields["step"]))
        elif rec.event == Event.PROGRESS:
            if isinstance(fields.get("step"), int):
                data.steps.append((at, rec.run, fields["step"]))
            if isinstance(fields.get("loss"), int | float):
                data.losses.append((at, rec.run, float(fields["loss"])))
        elif rec.event == Event.EXIT and rec.run in data.runs:
            span = data.runs[rec.run]
            span.end, span.verdict, span.reason = (
                at,
                str(fields.get("verdict")),
                str(fields.get("reason")),
            )
            if isinstance(fields.get("step"), int):
                span.last_step = fields["step"]
                data.steps.append((at, rec.run, fields["step"]))
        elif rec.event in (Event.GPU, Event.GPU_SNAPSHOT):
            for gpu in fields.get("gpus") or []:
                if gpu.get("memory_used_mib") is None or not isinstance(gpu.get("index"), int):
                    continue
                data.gpu_memory.setdefault(gpu["index"], []).append(
                    (at, float(gpu["memory_used_mib"]))
                )
                if gpu.get("memory_total_mib"):
                    data.gpu_total[gpu["index"]] = float(gpu["memory_total_mib"])
        elif rec.event == Event.FATAL:
            data.fatal.append((at, rec.run, str(fields.get("reason"))))
        elif rec.event == Event.STACKS and isinstance(fields.get("path"), str):
            data.dumps.append((at, rec.run, str(fields.get("trigger")), fields["path"]))
    return data


def _clock(epoch_s: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(epoch_s, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def timeline_svg(data: ReportData) -> str:
    """Each run as a bar over time, in the run's colour, labelled with its verdict and reason."""
    lo, hi = data.span
    runs = sorted(data.runs.values(), key=lambda r: r.run)
    row = 22
    height = 30 + row * max(1, len(runs)) + 24
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{height}" viewBox="0 0 {_W} {height}" font-family="sans-serif">'
    ]
    parts.append('<text x="4" y="14" font-size="12" font-weight="bold">Runs</text>')
    for i, span in enumerate(runs):
        y = 24 + i * row
        x0 = x_of(span.start, lo, hi)
        x1 = max(x0 + 2, x_of(span.end if span.end else hi, lo, hi))
        color = data.color(span.run)
        title = html.escape(f"run {span.run}: {span.verdict} ({span.reason})")
        parts.append(
            f'<rect x="{x0:.1f}" y="{y}" width="{x1 - x0:.1f}" height="{row - 6}" fill="{color}" rx="2">'
            f"<title>{title}</title></rect>"
        )
        if span.first_step_at is not None:  # a notch under the label line, never through it
            xf = x_of(span.first_step_at, lo, hi)
            parts.append(
                f'<path d="M{xf - 4:.1f},{y + row - 6} L{xf:.1f},{y + row - 11} L{xf + 4:.1f},{y + row - 6} Z" fill="#fff">'
                "<title>first step</title></path>"
            )
        parts.append(
            f'<text x="{_LEFT - 6}" y="{y + 12}" font-size="11" text-anchor="end">run {span.run}</text>'
        )
        label = f"{html.escape(span.verdict)} {html.escape(span.reason)}"
        if x1 - x0 > 220:  # wide bar: the label inside, in white
            where = f'x="{x0 + 6:.1f}" fill="#fff"'
        elif x1 + 200 < _W:  # room after the bar
            where = f'x="{x1 + 4:.1f}" fill="#333"'
        else:  # at the right edge: before the bar
            where = f'x="{x0 - 4:.1f}" fill="#333" text-anchor="end"'
        parts.append(f'<text {where} y="{y + 12}" font-size="10">{label}</text>')
        for at, _, why, path in (d for d in data.dumps if d[1] == span.run):  # stack dumps
            xd = x_of(at, lo, hi)
            href = html.escape("file://" + path, quote=True)
            parts.append(
                f'<a href="{href}"><circle cx="{xd:.1f}" cy="{y + 2}" r="4" fill="#fff" '
                f'stroke="#222"><title>{html.escape(f"stack dump ({why})")}</title></circle></a>'
            )
    parts.append(axis_svg(lo, hi, height - 22))
    parts.append("</svg>")
    return "".join(parts)


def _line_chart(
    title: str,
    series: dict[str, tuple[str, list[tuple[float, float]]]],
    lo: float,
    hi: float,
    unit: str,
    zero_based: bool = True,
) -> str:
    """Lines over the shared time axis; ``series``: name -> (colour, points).  The legend sits
    in the title row, outside the plot, so it never covers a line's end.  ``zero_based``:
    the value axis starts at 0 (steps, memory), else it spans the data (the loss)."""
    height = 170
    top, bottom = 34, height - 24
    values = [v for _, pts in series.values() for _, v in pts]
    vmax = max(values) if values else 1.0
    vmin = 0.0
    if not zero_based and values:  # the loss: its own range, padded, not squeezed above 0
        pad = (vmax - min(values)) * 0.08 or abs(vmax) * 0.05 or 1.0
        vmin, vmax = min(values) - pad, vmax + pad
        if min(values) >= 0:
            vmin = max(0.0, vmin)  # a loss that is never negative: no axis below zero
    vmax = vmax if vmax > vmin else vmin + 1.0
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{height}" viewBox="0 0 {_W} {height}" font-family="sans-serif">'
    ]
    parts.append(
        f'<text x="4" y="14" font-size="12" font-weight="bold">{html.escape(title)}</text>'
    )
    label = f"{vmax:,.0f}{unit}" if vmax >= 10 else f"{vmax:.3g}{unit}"
    parts.append(
        f'<text x="{_LEFT - 6}" y="{top + 8}" font-size="10" text-anchor="end">{label}</text>'
    )
    low = "0" if vmin == 0 else (f"{vmin:,.0f}" if abs(vmin) >= 10 else f"{vmin:.3g}")
    parts.append(
        f'<text x="{_LEFT - 6}" y="{bottom}" font-size="10" text-anchor="end">{low}</text>'
    )
    legend_x = _LEFT + 80
    for name, (color, pts) in series.items():
        if not pts:
            continue
        coords = " ".join(
            f"{x_of(t, lo, hi):.1f},{bottom - ((v - vmin) / (vmax - vmin)) * (bottom - top):.1f}"
            for t, v in sorted(pts)
        )
        parts.append(
            f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="1.5"/>'
        )
        for point in coords.split():  # markers, so a series of one point still shows
            px, py = point.split(",")
            parts.append(f'<circle cx="{px}" cy="{py}" r="2" fill="{color}"/>')
        if legend_x < _W - 60:
            parts.append(
                f'<rect x="{legend_x}" y="6" width="10" height="10" fill="{color}"/>'
                f'<text x="{legend_x + 14}" y="15" font-size="10" fill="#333">{html.escape(name)}</text>'
            )
            legend_x += 24 + 7 * len(name)
    parts.append(axis_svg(lo, hi, bottom))
    parts.append("</svg>")
    return "".join(parts)


def _per_run(data: ReportData, points: list[tuple[float, int, float]]) -> dict[str, Any]:
    series: dict[str, tuple[str, list[tuple[float, float]]]] = {}
    for t, run, value in sorted(points, key=lambda p: (p[1], p[0])):
        name = f"run {run}"
        series.setdefault(name, (data.color(run), []))[1].append((t, value))
    return series


def steps_svg(data: ReportData) -> str:
    """The step over time, one line per run, in the run's colour."""
    lo, hi = data.span
    points = [(t, run, float(step)) for t, run, step in data.steps]
    return _line_chart("Steps", _per_run(data, points), lo, hi, "")


def loss_svg(data: ReportData) -> str:
    """The training loss over time, one line per run (from recognised formats or notify)."""
    lo, hi = data.span
    return _line_chart("Loss", _per_run(data, data.losses), lo, hi, "", zero_based=False)


def gpu_svg(data: ReportData) -> str:
    """Memory used per GPU over time."""
    lo, hi = data.span
    series = {
        f"gpu {i}": (_GPU_PALETTE[n % len(_GPU_PALETTE)], pts)
        for n, (i, pts) in enumerate(sorted(data.gpu_memory.items()))
    }
    return _line_chart("GPU memory used", series, lo, hi, " MiB")


def _seconds_text(seconds: float) -> str:
    """A duration as status and the goodput table say it: ``7m02s``; under 10 s, ``3.2s``."""
    return duration_text(seconds) if seconds >= 10 else f"{seconds:.1f}s"


def render_html(data: ReportData, title: str) -> str:
    """The whole page: a summary table and the three charts."""
    rows = []
    for span in sorted(data.runs.values(), key=lambda r: r.run):
        lasted = span.end - span.start if span.end else None
        duration = "running" if lasted is None else _seconds_text(lasted)
        first = f"{span.first_step_at - span.start:.1f}s" if span.first_step_at else "-"
        color, shade = data.color(span.run), data.verdict_color(span.verdict)
        swatch = f"<span style='color:{color}'>&#9632;</span>"
        rows.append(
            f"<tr><td>{swatch} {span.run}</td><td style='color:{shade}'><b>{html.escape(span.verdict)}</b></td>"
            f"<td>{html.escape(span.reason)}</td><td>{duration}</td><td>{first}</td>"
            f"<td>{'' if span.last_step is None else span.last_step}</td></tr>"
        )
    fatal = "".join(
        f"<p class='fatal'>fatal after run {run} at {_clock(at)} UTC: {html.escape(reason)}</p>"
        for at, run, reason in data.fatal
    )
    dumps = "".join(
        f"<li>{_clock(at)} UTC, run {run}, {html.escape(why)}: "
        f"<a href='{html.escape('file://' + path, quote=True)}'>{html.escape(path)}</a></li>"
        for at, run, why, path in data.dumps
    )
    dumps = f"<p>Stack dumps (circles on the timeline):</p><ul>{dumps}</ul>" if dumps else ""
    loss = f"<div>{loss_svg(data)}</div>" if data.losses else ""
    gpu = (
        gpu_svg(data) if data.gpu_memory else "<p>No GPU records in this log (GPU checks off).</p>"
    )
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:20px;color:#222}}table{{border-collapse:collapse}}
td,th{{padding:3px 10px;border-bottom:1px solid #ddd;text-align:left}}.fatal{{color:#c62828;font-weight:bold}}
svg{{width:100%;height:auto;display:block}}.incidents{{margin-bottom:18px}}.note{{color:#555}}</style>
</head><body>
<h2>{html.escape(title)}</h2>
<table><tr><th>run</th><th>verdict</th><th>reason</th><th>duration</th><th>first step after</th><th>last step</th></tr>
{"".join(rows)}</table>
{fatal}
{goodput_section(data.goodput, *data.span)}
<div>{timeline_svg(data)}</div>
{dumps}
<div>{steps_svg(data)}</div>
{loss}
<div>{gpu}</div>
</body></html>
"""


def svg_document(data: ReportData) -> str:
    """The three charts stacked in one SVG (for ``-o report.svg``)."""
    charts = [timeline_svg(data), steps_svg(data)]
    if data.losses:
        charts.append(loss_svg(data))
    if data.gpu_memory:
        charts.append(gpu_svg(data))
    y = 0
    body = []
    for chart in charts:
        height = int(chart.split('height="', 1)[1].split('"', 1)[0])
        body.append(f'<g transform="translate(0,{y})">{chart}</g>')
        y += height + 10
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{y}">'
        f'<rect width="100%" height="100%" fill="white"/>{"".join(body)}</svg>'
    )


def summarize(data: ReportData) -> dict[str, Any]:
    """Counts for the CLI's one-line confirmation."""
    verdicts: dict[str, int] = {}
    for span in data.runs.values():
        verdicts[span.verdict] = verdicts.get(span.verdict, 0) + 1
    return {
        "runs": len(data.runs),
        "verdicts": verdicts,
        "gpu_points": sum(map(len, data.gpu_memory.values())),
    }
