"""The report at a glance (issue 44), from a real daemon's log through the CLI.

Colours mean how a run ended (never which run it was), the headline's goodput is the bar's,
there is one table of runs and each row says its command, start (with the year) and error,
and the timeline's marks have a legend.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from dflashd.logs import RotatingLogWriter, read_records
from dflashd.supervisor.client.htmlreport import render_html
from dflashd.supervisor.client.reportdata import VERDICT_COLORS, collect

JOB = """
import os, sys
n = int(open("count").read()) if os.path.exists("count") else 0
open("count", "w").write(str(n + 1))
for s in range(1, 6):
    print(f"step {s} loss {2.0 / s:.3f}", flush=True)
if n < 2:
    print("RuntimeError: CUDA error: an illegal memory access was encountered", file=sys.stderr)
    sys.exit(1)
"""


def dflashd(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "dflashd.supervisor", *args]
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def test_a_real_daemons_report_reads_at_a_glance(tmp_path: Path) -> None:
    """Two crashes then a completion: red, red, green; one table with the command once, each
    run's start with its year and each crash's error line; the headline equals the bar."""
    (tmp_path / "job.py").write_text(JOB)
    home = str(tmp_path / "home")
    ran = dflashd(
        "start", "--foreground", "--quiet", "--home", home, "--", "python3", "job.py", cwd=tmp_path
    )
    assert ran.returncode == 0, ran.stderr
    out = tmp_path / "r.html"
    made = dflashd("report", "--home", home, "-o", str(out), cwd=tmp_path)
    assert made.returncode == 0 and "completed 1, crashed 2" in made.stdout, made
    page = out.read_text()

    red, green = VERDICT_COLORS["crashed"], VERDICT_COLORS["completed"]
    bars = re.findall(r'<rect [^>]*fill="(#\w+)" rx="2"><title>run (\d+): (\w+)', page)
    assert [(run, verdict, fill) for fill, run, verdict in bars] == [
        ("1", "crashed", red),
        ("2", "crashed", red),
        ("3", "completed", green),
    ]
    assert page.count("<table") == 1  # one run table, the goodput columns in it
    assert page.count("<code>$ python3 job.py</code>") == 1  # said once, then "the same command"
    assert page.count("the same command") == 2
    assert page.count("RuntimeError: CUDA error: an illegal memory access") == 2
    year = re.findall(r"<td>(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})</td>", page)
    assert len(year) == 3  # each run's start, with the year
    headline = re.search(r"Goodput: ([\d.]+%) of", page)
    assert headline is not None
    assert "productive " in page and f"({headline.group(1)})</text>" in page  # the bar's legend
    assert "first step</text>" in page  # the notch's legend


def test_colours_never_repeat_by_run_number_and_say_stopped_in_grey(tmp_path: Path) -> None:
    """Thirteen runs: the twelfth and the second look alike only if they ended alike; a stopped
    run is grey, never red."""
    writer = RotatingLogWriter(tmp_path / "logs", clock=lambda: clock[0])
    clock = [1_800_000_000.0]
    verdicts = ["crashed"] * 10 + ["stalled", "stopped", "completed"]
    for run, verdict in enumerate(verdicts, start=1):
        writer.write_event(run, "spawn", {"argv": ["python", "train.py"], "cwd": "/srv"})
        clock[0] += 5
        writer.write_event(run, "first_step", {"step": 1})
        clock[0] += 55
        writer.write_event(
            run, "exit", {"verdict": verdict, "reason": "x", "step": 9, "tail": ["boom"]}
        )
        clock[0] += 1
    writer.close()
    data = collect(read_records(tmp_path / "logs"))
    assert data.color(2) == data.color(10) == VERDICT_COLORS["crashed"]
    assert data.color(12) == VERDICT_COLORS["stopped"] == "#757575"
    assert data.color(11) != data.color(12) != data.color(13)
    page = render_html(data, "t")
    assert (
        page.count("<code class='error'>boom</code>") == 11
    )  # a stopped or completed run: no error


def test_status_on_a_home_you_may_not_read_says_so(tmp_path: Path) -> None:
    """As another user, ``status`` on root's private home names its owner and how to read it
    (exit 2), and on a home under a directory closed to the user says permission denied —
    never "not running"."""
    import os
    import pwd

    import pytest

    if os.geteuid() != 0:
        pytest.skip("needs root: the home is made for another user than the one asking")
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no 'nobody' user here")
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(dir="/tmp"))  # pytest's own tmp root is closed to others
    base.chmod(0o755)
    try:
        _status_as_nobody(base, nobody)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _status_as_nobody(base: Path, nobody: Any) -> None:
    import os

    home = base / "home"
    home.mkdir(mode=0o700)
    closed = base / "closed"
    (closed / "home").mkdir(parents=True)
    closed.chmod(0o700)

    def as_nobody(where: Path) -> tuple[int, str]:
        """``dflashd status --home WHERE`` run by the real CLI in a forked process that is
        user nobody (this venv's interpreter may sit where nobody cannot exec it)."""
        import json

        from click.testing import CliRunner

        from dflashd.supervisor.client.cli import main

        reader, writer = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: become nobody, run the command, report, exit
            code = 99
            try:
                os.close(reader)
                os.setgroups([])
                os.setgid(nobody.pw_gid)
                os.setuid(nobody.pw_uid)
                done = CliRunner().invoke(main, ["status", "--home", str(where)])
                os.write(writer, json.dumps([done.exit_code, done.output]).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(writer)
        with os.fdopen(reader, "rb") as got:
            payload = got.read()
        assert os.waitpid(pid, 0)[1] == 0, payload
        code, output = json.loads(payload)
        return int(code), str(output)

    code, said = as_nobody(home)
    assert code == 2, said
    assert "belongs to root (uid 0), not to you" in said
    assert f"sudo -u root dflashd status --home {home}" in said
    assert "not running" not in said
    code, said = as_nobody(closed / "home")
    assert code == 2 and "you may not read it (permission denied" in said, said
