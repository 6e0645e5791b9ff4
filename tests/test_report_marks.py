"""Issue 54: a divergence seen in the report (its row, a banner, the loss chart), a loss axis
that a first loss of 50 does not flatten, time ticks that never read alike, and goodput colours
that are no verdict's.  Pure: records in, the page out."""

from __future__ import annotations

import re

from dflashd.supervisor.client.reportdata import collect
from tests.tables import event_at


def test_a_divergence_is_marked_in_the_reports_row_banner_and_loss_chart() -> None:
    """Issue 54: after NaN at step 60 the report must not read as a healthy run."""
    from dflashd.supervisor.client.htmlreport import loss_svg, render_html

    records = [
        event_at(1, "spawn", 0.0, argv=["python", "t.py"], start="cold"),
        event_at(1, "first_step", 1.0, step=1),
        *(event_at(1, "progress", 1.0 + i, step=i, loss=50.0 / i**1.5) for i in range(1, 60)),
        event_at(1, "diverged", 61.0, step=60, last_good_step=59, why="loss nan", then="alert"),
        event_at(1, "exit", 70.0, verdict="crashed", reason="exit 1", step=70),
    ]
    data = collect(records)
    assert data.diverged == [(data.diverged[0][0], 1, 60, 59)]
    page = render_html(data, "t")
    assert page.count("loss diverged at step 60 (last good step 59)") >= 3  # row, banner, chart
    chart = loss_svg(data)
    assert "Loss (log scale)" in chart  # 50 down to 0.11: a first loss of 50 flattens nothing
    assert 'stroke-dasharray="4 3"' in chart


def test_time_ticks_never_read_alike_and_goodput_colours_are_no_verdicts() -> None:
    from dflashd.supervisor.client.goodputhtml import BUCKETS
    from dflashd.supervisor.client.reportdata import VERDICT_COLORS
    from dflashd.supervisor.client.svgaxis import axis_svg

    def labels(lo: float, hi: float) -> list[str]:
        return re.findall(r'fill="#555">([^<]+)</text>', axis_svg(lo, hi, 100.0))[1:]

    short = labels(1_764_800_000.0, 1_764_800_090.0)  # a 90 s run
    assert len(set(short)) == 6 and short[0].startswith("2025-") and short[1].count(":") == 2
    week = labels(1_764_800_000.0, 1_764_800_000.0 + 7 * 86400)
    assert len(set(week)) == 6 and all(label.startswith("2025-") for label in week)
    assert not {color for _, _, color in BUCKETS} & set(VERDICT_COLORS.values())
