"""The report's shared time axis: where a time falls on the page, and the axis drawn under a chart."""

from __future__ import annotations

import datetime as dt
from typing import Final

WIDTH: Final = 900  # the drawing's width; the page scales it to its own
LEFT: Final = 70
RIGHT: Final = 20


def x_of(t: float, lo: float, hi: float) -> float:
    """The x of time ``t`` on an axis from ``lo`` to ``hi``."""
    return LEFT + (t - lo) / (hi - lo) * (WIDTH - LEFT - RIGHT)


def tick_format(span_s: float) -> str:
    """The strftime of a tick for an axis spanning ``span_s``: six ticks never read alike
    (seconds under 10 minutes, minutes under 2 days, then the date); the year always on the
    first tick: "12-02" reads as February to half the world."""
    if span_s < 600:
        return "%H:%M:%S"
    if span_s < 2 * 86400:
        return "%H:%M"
    return "%Y-%m-%d %H:%M"


def axis_svg(lo: float, hi: float, y: float) -> str:
    """Six ticks labelled in a unit chosen by the span, in UTC (said at the axis's left end),
    the first with its date."""
    ticks = []
    unit = tick_format(hi - lo)
    for i in range(6):
        t = lo + (hi - lo) * i / 5
        stamp = dt.datetime.fromtimestamp(t, tz=dt.UTC)
        label = stamp.strftime(unit if i or "%Y" in unit else f"%Y-%m-%d {unit}")
        anchor = "end" if i == 5 else "start" if i == 0 else "middle"  # inside the picture
        x = x_of(t, lo, hi)
        ticks.append(
            f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 4}" stroke="#999"/>'
            f'<text x="{x:.1f}" y="{y + 16}" font-size="10" text-anchor="{anchor}" fill="#555">{label}</text>'
        )
    utc = (
        f'<text x="{LEFT - 6}" y="{y + 16}" font-size="10" text-anchor="end" fill="#555">UTC</text>'
    )
    line = f'<line x1="{LEFT}" y1="{y}" x2="{WIDTH - RIGHT}" y2="{y}" stroke="#999"/>'
    return line + utc + "".join(ticks)
