"""Goodput (issue 33) on a GPU: the bundled trainer SIGKILLed mid-run, and the ledger it leaves.

    python3 tests/gpu/goodput_gpu.py      (after tests/gpu/_env.sh, as run_gpu_checks.sh does)

The trainer (flex compiled per thread, a checkpoint every 100 steps) is SIGKILLed once it is
past a checkpoint; its relaunch resumes from the checkpoint and steps on past the best, then
``dflashd stop``.  Prints status's ``goodput`` beside the raw records it came from: each
``exit``'s ``cost`` and step, each ``spawn``'s ``downtime_s``, the ``restart`` delay.
Writes $OUT/goodput_gpu.json.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: find tests/
from tests.gpu.custody_gpu import cli, events, wait_event
from tests.helpers import daemon_argv

KILL_PAST = 40  # steps past the last checkpoint when the trainer is killed


def wait_for_step(home: Path, step: int, timeout_s: float = 240.0) -> None:
    """Until status says the run reached ``step`` (the steps reach dflashd by notify, and
    status is their only observable from here: polled, bounded by a deadline)."""
    deadline = time.monotonic() + timeout_s
    while (json.loads(cli(home, "status", "--json").stdout).get("step") or 0) < step:
        if time.monotonic() > deadline:
            raise AssertionError(f"step {step} not reached within {timeout_s:g}s")
        time.sleep(0.2)


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="dflashd-goodput-gpu-"))
    home = work / "home"
    config = work / "c.toml"
    command = [sys.executable, "-m", "dflashd.trainer", "--steps", "100000"]
    command += ["--checkpoint-every", "100", "--log-every", "10"]
    config.write_text("command = " + json.dumps(command) + "\n")
    daemon = subprocess.Popen(daemon_argv(home, config), stdout=subprocess.DEVNULL)
    out: dict[str, Any] = {}
    try:
        first = wait_event(home, lambda r: r.event == "first_step", 300)
        launched = events(home, "launched")[0]
        wait_for_step(home, 100 + KILL_PAST)
        os.kill(int(launched.fields["pid"]), signal.SIGKILL)
        exit_one = wait_event(home, lambda r: r.event == "exit", 60)
        best = int(exit_one.fields.get("step") or 0)
        wait_event(home, lambda r: r.event == "first_step" and r.run == 2, 300)
        wait_for_step(home, best + 200)
        out["first_step_after_s"] = first.fields.get("after_s")
        cli(home, "stop", "--timeout", "60")
        daemon.wait(120)
        status = json.loads(cli(home, "status", "--json").stdout)
        keys = ("verdict", "reason", "signal", "step", "first_step_after_s", "duration_s", "cost")
        out["exits"] = [{k: e.fields.get(k) for k in keys} for e in events(home, "exit")]
        out["spawns"] = [
            {"run": e.run, "downtime_s": e.fields.get("downtime_s")} for e in events(home, "spawn")
        ]
        out["restarts"] = [e.fields for e in events(home, "restart")]
        out["first_steps"] = [{"run": e.run, **e.fields} for e in events(home, "first_step")]
        out["goodput"] = status.get("goodput")
        out["status_text"] = [
            line for line in cli(home, "status").stdout.splitlines() if line.startswith("goodput")
        ]
    finally:
        if daemon.poll() is None:
            cli(home, "stop", "--timeout", "5")
            daemon.wait(60)
    print(json.dumps(out, indent=1), flush=True)
    (Path(os.environ.get("OUT", work)) / "goodput_gpu.json").write_text(json.dumps(out, indent=1))
    exits = out["exits"]
    ok = [e["verdict"] for e in exits][:1] == ["crashed"] and (exits[1]["cost"] or {}).get(
        "redone_s", 0
    ) > 0
    print(f"\nSIGKILL past a checkpoint shows its repeated steps as redone: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
