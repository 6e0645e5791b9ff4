"""Issue 50 (5): the daemon SIGKILLed in the middle of an incident and started again.

The job steps, then freezes on a lock of its own (a hang, with no output); the daemon is
killed while its quick look or its long path is under way, and a new daemon is started on the
same home.  Whenever the kill lands, the frozen run ends once (``lost`` with the daemon, or
``stalled``/``hung`` if the first daemon decided before it died), is alerted once, its process
is gone, the next run completes, and the goodput ledger counts no second twice.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from dflashd.logs import LineRecord
from tests.conftest import Daemon
from tests.helpers import run_cli

JOB = """
import os, sys, threading, time
run = int(os.environ.get("DFLASHD_RUN", "1"))
for step in range(1, 400):
    time.sleep(0.05)
    print(f"step {step} loss {1.0 / step:.4f}", flush=True)
    if step == 40 and run == 1:
        print(os.getpid(), file=open(sys.argv[1], "w"), flush=True)
        lock = threading.Lock(); lock.acquire(); lock.acquire()
    if run > 1 and step >= 60:
        sys.exit(0)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_daemon_killed_mid_hang_ends_the_run_once_alerts_once_and_counts_once(
    tmp_path: Path, home: Path, start_daemon: Callable[..., Daemon]
) -> None:
    job, pid_file, alerts = tmp_path / "job.py", tmp_path / "frozen.pid", tmp_path / "alerts"
    job.write_text(JOB)
    command = [sys.executable, str(job), str(pid_file)]
    sink = {"file": str(alerts), "on": ["lost", "stalled", "crashed", "recovered", "fatal"]}
    began = time.monotonic()
    first = start_daemon(command, alerts=sink)
    first.wait_for(lambda r: isinstance(r, LineRecord) and r.line.startswith("step 40 "))
    time.sleep(5.0)  # pacing, not a synchronisation: into the silence, where the quick look runs
    first.proc.send_signal(signal.SIGKILL)
    first.wait(10)
    frozen = int(pid_file.read_text())
    second = start_daemon(command, alerts=sink)
    done = second.wait_event("done", timeout=120)
    assert done.fields["verdict"] == "completed"
    wall = time.monotonic() - began

    ends = [e for e in second.events("exit") if e.run == 1]
    assert len(ends) == 1, ends
    end = ends[0].fields
    assert (end["verdict"], end["reason"]) in (("lost", "daemon_killed"), ("stalled", "hung"))
    assert end["step"] == 40, end
    assert not _alive(frozen), "the frozen run was left behind"
    sent = [json.loads(line) for line in alerts.read_text().splitlines() if line.strip()]
    about_run_1 = [a for a in sent if a["run"] == 1]
    assert len(about_run_1) == 1, sent
    assert about_run_1[0]["verdict"] == end["verdict"] and about_run_1[0]["step"] == 40
    assert [e.run for e in second.events("exit")] == [1, 2]
    assert second.events("exit")[-1].fields["verdict"] == "completed"

    shown = run_cli("status", "--json", "--home", str(home))  # exit 3: the daemon has ended
    goodput = json.loads(shown.stdout)["goodput"]
    lost = sum(goodput["lost_s"].values())
    assert lost + goodput["productive_s"] <= wall + 1.0, (goodput, wall)
