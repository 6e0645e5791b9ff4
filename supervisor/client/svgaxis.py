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


def axis_svg(lo: float, hi: float, y: float) -> str:
    """Six ticks labelled with the date and time, in UTC (said at the axis's left end)."""
    ticks = []
    for i in range(6):
        t = lo + (hi - lo) * i / 5
        # the year too: "12-02" reads as February to half the world
        label = dt.datetime.fromtimestamp(t, tz=dt.UTC).strftime("%Y-%m-%d %H:%M")
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
