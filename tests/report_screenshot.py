"""Render `dflashd report` for the test fixture and screenshot it in headless Chromium.

    python tests/report_screenshot.py [OUT_DIR]      (Debian: apt-get install chromium)

Two window sizes, a wide one (1280 px) and a narrow one (820 px); the wide one is kept in
docs/report.png.  The page is static HTML with inline SVG: no script runs.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from dflashd.logs import read_records
from dflashd.supervisor.client.htmlreport import render_html
from dflashd.supervisor.client.reportdata import collect

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.test_report import write_fixture

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs")
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        print("chromium not found (apt-get install chromium)")
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp) / "logs"
        write_fixture(logs)
        page = Path(tmp) / "report.html"
        page.write_text(render_html(collect(read_records(logs)), "dflashd runs (fixture)"))
        for name, size in (("report.png", "1280,1000"), ("report-narrow.png", "820,1000")):
            target = out / name
            subprocess.run(
                [
                    browser,
                    *FLAGS,
                    f"--user-data-dir={tmp}/profile",
                    f"--window-size={size}",
                    f"--screenshot={target.absolute()}",
                    page.as_uri(),
                ],
                check=True,
                capture_output=True,
                timeout=120,
            )
            print(f"{target}: {target.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
