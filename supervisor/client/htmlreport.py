"""``dflashd report``: one self-contained HTML page (inline SVG, no dependencies) from the run log.

The goodput headline and its bar, the one table of runs, then charts on one time axis: each
run's span in its verdict's colour and labelled with it, the step and the loss over time (from
``first_step``, ``progress`` and ``exit`` records), and each GPU's memory from the ``gpu``
records.  Everything is computed from the log by pure functions; nothing runs in the daemon.
"""

from __future__ import annotations

import html
import math
from typing import Any, Final

from dflashd.supervisor.client.goodputhtml import goodput_section
from dflashd.supervisor.client.reportdata import ReportData, diverged_text, verdict_color
from dflashd.supervisor.client.runtable import run_table
from dflashd.supervisor.client.svgaxis import LEFT as _LEFT
from dflashd.supervisor.client.svgaxis import WIDTH as _W
from dflashd.supervisor.client.svgaxis import axis_svg, x_of

_GPU_PALETTE: Final = ("#1565c0", "#00838f", "#6a1b9a", "#ef6c00", "#5d4037", "#37474f")
LOG_LOSS_SPAN: Final = 100.0  # a loss range wider than this many times is drawn on a log axis


def _clock(epoch_s: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(epoch_s, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def timeline_svg(data: ReportData) -> str:
    """Each run as a bar over time, in its verdict's colour and labelled with it; a legend of
    the colours, the first-step notch and the stack-dump circle in the title row."""
    lo, hi = data.span
    runs = sorted(data.runs.values(), key=lambda r: r.run)
    row = 22
    height = 30 + row * max(1, len(runs)) + 24
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{height}" viewBox="0 0 {_W} {height}" font-family="sans-serif">'
    ]
    parts.append('<text x="4" y="14" font-size="12" font-weight="bold">Runs</text>')
    parts.append(_timeline_legend(data))
    for i, span in enumerate(runs):
        y = 24 + i * row
        x0 = x_of(span.start, lo, hi)
        x1 = max(x0 + 2, x_of(span.end if span.end else hi, lo, hi))
        verdict = data.verdict_of(span)
        color = verdict_color(verdict)
        title = html.escape(f"run {span.run}: {verdict} ({span.reason})")
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
        label = f"{html.escape(verdict)} {html.escape(span.reason)}"
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


def _timeline_legend(data: ReportData) -> str:
    """The verdicts' colours present, the first-step notch and (if any) the stack-dump circle."""
    x, parts = float(_LEFT), []
    verdicts = dict.fromkeys(
        data.verdict_of(s) for s in sorted(data.runs.values(), key=lambda r: r.run)
    )
    for verdict in verdicts:
        parts.append(
            f'<rect x="{x:.1f}" y="5" width="10" height="10" fill="{verdict_color(verdict)}"/>'
            f'<text x="{x + 13:.1f}" y="14" font-size="10" fill="#333">{html.escape(verdict)}</text>'
        )
        x += 22 + 6 * len(verdict)
    parts.append(  # a bar with its notch, as drawn on the runs
        f'<rect x="{x:.1f}" y="4" width="16" height="12" fill="#757575" rx="2"/>'
        f'<path d="M{x + 4:.1f},16 L{x + 8:.1f},11 L{x + 12:.1f},16 Z" fill="#fff"/>'
        f'<text x="{x + 19:.1f}" y="14" font-size="10" fill="#333">first step</text>'
    )
    x += 80
    if data.dumps:
        parts.append(
            f'<circle cx="{x + 5:.1f}" cy="10" r="4" fill="#fff" stroke="#222"/>'
            f'<text x="{x + 13:.1f}" y="14" font-size="10" fill="#333">stack dump (click)</text>'
        )
    return "".join(parts)


def _line_chart(
    title: str,
    series: dict[str, tuple[str, list[tuple[float, float]]]],
    lo: float,
    hi: float,
    unit: str,
    zero_based: bool = True,
    legend: dict[str, str] | None = None,
    log: bool = False,
) -> str:
    """Lines over the shared time axis; ``series``: name -> (colour, points), the name each
    line's hover title.  The legend (label -> colour; by default the series' own) sits in the
    title row, outside the plot, so it never covers a line's end.  ``zero_based``: the value
    axis starts at 0 (steps, memory), else it spans the data (the loss)."""
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
    if log:  # the values are log10s: label the ends with what they stand for
        label = f"{10**vmax:.3g}{unit}"
    parts.append(
        f'<text x="{_LEFT - 6}" y="{top + 8}" font-size="10" text-anchor="end">{label}</text>'
    )
    low = "0" if vmin == 0 else (f"{vmin:,.0f}" if abs(vmin) >= 10 else f"{vmin:.3g}")
    if log:
        low = f"{10**vmin:.3g}"
    parts.append(
        f'<text x="{_LEFT - 6}" y="{bottom}" font-size="10" text-anchor="end">{low}</text>'
    )
    for name, (color, pts) in series.items():
        if not pts:
            continue
        coords = " ".join(
            f"{x_of(t, lo, hi):.1f},{bottom - ((v - vmin) / (vmax - vmin)) * (bottom - top):.1f}"
            for t, v in sorted(pts)
        )
        parts.append(
            f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="1.5">'
            f"<title>{html.escape(name)}</title></polyline>"
        )
        for point in coords.split():  # markers, so a series of one point still shows
            px, py = point.split(",")
            parts.append(f'<circle cx="{px}" cy="{py}" r="2" fill="{color}"/>')
    shown = legend if legend is not None else {n: c for n, (c, pts) in series.items() if pts}
    legend_x = _LEFT + 80
    for name, color in shown.items():
        if legend_x < _W - 60:
            parts.append(
                f'<rect x="{legend_x}" y="6" width="10" height="10" fill="{color}"/>'
                f'<text x="{legend_x + 14}" y="15" font-size="10" fill="#333">{html.escape(name)}</text>'
            )
            legend_x += 24 + 7 * len(name)
    parts.append(axis_svg(lo, hi, bottom))
    parts.append("</svg>")
    return "".join(parts)


def _per_run(
    data: ReportData, points: list[tuple[float, int, float]]
) -> tuple[dict[str, Any], dict[str, str]]:
    """One line per run in its verdict's colour, and the legend: the verdicts drawn."""
    series: dict[str, tuple[str, list[tuple[float, float]]]] = {}
    legend: dict[str, str] = {}
    for t, run, value in sorted(points, key=lambda p: (p[1], p[0])):
        span = data.runs.get(run)
        verdict = data.verdict_of(span) if span is not None else "running"
        series.setdefault(f"run {run}: {verdict}", (data.color(run), []))[1].append((t, value))
        legend.setdefault(verdict, data.color(run))
    return series, legend


def steps_svg(data: ReportData) -> str:
    """The step over time, one line per run, in its verdict's colour."""
    lo, hi = data.span
    series, legend = _per_run(data, [(t, run, float(step)) for t, run, step in data.steps])
    return _line_chart("Steps", series, lo, hi, "", legend=legend)


def loss_svg(data: ReportData) -> str:
    """The training loss over time, one line per run (from recognised formats or notify); a
    range over 100 x is drawn on a log axis (a first loss of 50 must not flatten the curve),
    and each divergence is a dashed line at its time, labelled with its step."""
    lo, hi = data.span
    series, legend = _per_run(data, data.losses)
    values = [v for _, _, v in data.losses]
    log = bool(values) and min(values) > 0 and max(values) / min(values) > LOG_LOSS_SPAN
    if log:
        series = {
            name: (color, [(t, math.log10(v)) for t, v in pts])
            for name, (color, pts) in series.items()
        }
    title = "Loss (log scale)" if log else "Loss"
    chart = _line_chart(title, series, lo, hi, "", zero_based=False, legend=legend, log=log)
    marks = "".join(
        f'<line x1="{x_of(at, lo, hi):.1f}" y1="30" x2="{x_of(at, lo, hi):.1f}" y2="146" '
        f'stroke="{verdict_color("diverged")}" stroke-dasharray="4 3"/>'
        f'<text x="{x_of(at, lo, hi) + 3:.1f}" y="42" font-size="10" '
        f'fill="{verdict_color("diverged")}">{html.escape(diverged_text(step, good))}</text>'
        for at, _run, step, good in data.diverged
    )
    return chart.replace("</svg>", marks + "</svg>") if marks else chart


def gpu_svg(data: ReportData) -> str:
    """Memory used per GPU over time."""
    lo, hi = data.span
    series = {
        f"gpu {i}": (_GPU_PALETTE[n % len(_GPU_PALETTE)], pts)
        for n, (i, pts) in enumerate(sorted(data.gpu_memory.items()))
    }
    return _line_chart("GPU memory used", series, lo, hi, " MiB")


def render_html(data: ReportData, title: str) -> str:
    """The whole page: the goodput headline and bar, the one run table, the charts."""
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
    fatal += "".join(  # a divergence is never hidden behind a healthy-looking headline
        f"<p class='fatal'>run {run}: {html.escape(diverged_text(step, good))} at {_clock(at)} UTC"
        " (the line on the loss chart)</p>"
        for at, run, step, good in data.diverged
    )
    loss = f"<div>{loss_svg(data)}</div>" if data.losses else ""
    gpu = (
        gpu_svg(data) if data.gpu_memory else "<p>No GPU records in this log (GPU checks off).</p>"
    )
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:20px;color:#222}}table{{border-collapse:collapse}}
td,th{{padding:3px 10px;border-bottom:1px solid #ddd;text-align:left}}.fatal{{color:#c62828;font-weight:bold}}
td.num{{text-align:right}}tr.detail td{{border-bottom:1px solid #bbb;font-size:90%;padding-top:0}}
code.error{{color:#c62828}}svg{{width:100%;height:auto;display:block}}.note{{color:#555}}</style>
</head><body>
<h2>{html.escape(title)}</h2>
{goodput_section(data.goodput, *data.span)}
{run_table(data)}
{fatal}
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
