"""`dflashd report` rendered from a fixture log written by the real writer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from unittest import mock

from dflashd.logs import RotatingLogWriter, read_records
from dflashd.supervisor.client.htmlreport import loss_svg, render_html, svg_document
from dflashd.supervisor.client.reportdata import VERDICT_COLORS, collect


def write_fixture(logs: Path) -> None:
    """Three runs: an import-error crash, a crash at step 1200 after an XID, and one still running."""
    clock = [1_800_000_000.0]
    writer = RotatingLogWriter(logs, clock=lambda: clock[0])

    def at(seconds: float) -> None:
        clock[0] = 1_800_000_000.0 + seconds

    def gpu(mib: float) -> None:
        writer.write_event(
            0,
            "gpu",
            {
                "gpus": [
                    {"index": 0, "memory_used_mib": mib, "memory_total_mib": 81559.0},
                    {"index": 1, "memory_used_mib": mib / 2, "memory_total_mib": 81559.0},
                ]
            },
        )

    at(0)
    writer.write_event(1, "spawn", {"argv": ["python", "train.py"]})
    gpu(0)
    at(2)
    writer.write_event(
        1,
        "exit",
        {
            "verdict": "crash_before_first_step",
            "reason": "import_error",
            "step": None,
            "cost": {"startup_s": 2.0},
        },
    )
    at(3)
    writer.write_event(2, "spawn", {"argv": ["python", "train.py"], "downtime_s": 1.0})
    for i, t in enumerate(range(10, 400, 30)):
        at(t)
        gpu(30000 + i * 100)
        if t == 10:
            writer.write_event(2, "first_step", {"step": 1})
        else:
            writer.write_event(2, "progress", {"step": i * 100, "loss": 4.0 - i * 0.2})
    at(400)
    gpu(0)
    cost = {"startup_s": 7.0, "productive_s": 388.0, "detection_s": 2.0}
    writer.write_event(
        2, "exit", {"verdict": "crashed", "reason": "gpu_xid_79", "step": 1200, "cost": cost}
    )
    at(402)
    writer.write_event(3, "spawn", {"argv": ["python", "train.py"], "downtime_s": 2.0})
    at(420)
    writer.write_event(3, "first_step", {"step": 1201})
    gpu(31000)
    at(430)
    writer.write_event(3, "fatal", {"reason": "early_retries_exhausted"})
    writer.close()


def test_report_data_and_page(tmp_path: Path) -> None:
    """The fixture folds into three runs with their verdicts, a step series and two GPUs' memory."""
    write_fixture(tmp_path / "logs")
    data = collect(read_records(tmp_path / "logs"))
    assert [(r.run, r.verdict) for r in data.runs.values()] == [
        (1, "crash_before_first_step"),
        (2, "crashed"),
        (3, "running"),
    ]
    assert data.runs[2].last_step == 1200 and sorted(data.gpu_memory) == [0, 1]
    page = render_html(data, "fixture")
    assert page.count("<svg") == 6 and "gpu_xid_79" in page and "import_error" in page
    # goodput, from the exits' costs and the spawns' downtime: 388 s of 402 s, and run 3 (no
    # exit record, no daemon) settled up to its last record: 18 s of start-up (402 -> 420)
    assert "Goodput: 92.4% of 7m00s" in page
    assert data.goodput.cost_of(data.goodput.incidents[3]).startup_s == 18.0
    assert data.goodput.total.detection_s == 2.0 and data.goodput.total.downtime_s == 3.0
    assert data.goodput.incidents[2].downtime_after_s == 2.0
    assert "<script" not in page  # self-contained and static
    # A colour says how a run ended, in every chart and the table: run 2 crashed, so its bar,
    # its step line and its loss line are the crashed red; run 3 never wrote its exit.
    red = VERDICT_COLORS["crashed"]
    assert data.color(2) == red == "#c62828"
    assert page.count(f'stroke="{red}"') == 2  # its step line and its loss line
    assert f'fill="{red}" rx="2"><title>run 2: crashed' in page  # its timeline bar
    assert f"color:{red}'><b>crashed" in page
    assert "<b>no exit record</b>" in page  # no daemon holds the home: not "running"
    assert ">crashed gpu_xid_79</text>" in page
    # the loss axis spans the data (3.8 down to 1.6), not 0 to the top
    assert 'text-anchor="end">0</text>' not in loss_svg(data)
    assert (
        "UTC</text>" in page and "2027-01-15 08:00" in page
    )  # the axes: the year, date, time, UTC
    assert "svg{width:100%" in page  # the charts take the page's width
    assert [round(loss, 1) for _, run, loss in data.losses if run == 2][:2] == [3.8, 3.6]


def test_report_cli_writes_html_and_svg(tmp_path: Path) -> None:
    """The CLI writes the page and the SVG; the SVG renders to a PNG (looked at during development)."""
    home = tmp_path / "home"
    write_fixture(home / "logs")
    for name in ("report.html", "report.svg"):
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "dflashd.supervisor",
                "report",
                "--home",
                str(home),
                "-o",
                str(tmp_path / name),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert "3 runs" in result.stdout
    svg = (tmp_path / "report.svg").read_text()
    assert svg.startswith("<svg") and svg.count("<polyline") == 5  # 2 steps, 1 loss, 2 GPUs
    with mock.patch("sys.argv", ["x"]):
        assert svg_document(collect(read_records(home / "logs"))) == svg
