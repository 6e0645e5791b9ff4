"""Idle cost benchmark (issue 3): the daemon's RSS, CPU and wake-ups while its child idles.

The child reports READY and then sleeps; GPU polling is off (gpus = "none"), so no timer is
due for an hour (stall_timeout_s) and the daemon should not wake at all.

    python tests/perf/idle_cost.py [--seconds 60]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from _bench import daemon_argv

from dflashd.logs import EventRecord, follow

IDLE_CHILD = (
    "import os, socket, threading\n"
    "s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
    "s.sendto(b'READY=1\\nSTEP=1', os.environ['NOTIFY_SOCKET'])\n"
    "print('idle', flush=True)\n"
    "threading.Event().wait()\n"
)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dflashd-idle-") as tmp:
        home = Path(tmp) / "home"
        config = Path(tmp) / "idle.toml"
        config.write_text('gpus = "none"\nstall_timeout_s = 3600\n')
        argv = daemon_argv(home, config, [sys.executable, "-c", IDLE_CHILD])
        daemon = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        proc = psutil.Process(daemon.pid)
        # Start-up is over once the child reported READY: wait for that record (bounded), then measure.
        deadline = time.monotonic() + 30
        for record in follow(
            home / "logs", poll_s=0.05, should_stop=lambda: time.monotonic() > deadline
        ):
            if isinstance(record, EventRecord) and record.event == "first_step":
                break
        cpu0, ctx0 = proc.cpu_times(), proc.num_ctx_switches()
        threads0 = {t.id: t.user_time + t.system_time for t in proc.threads()}
        time.sleep(args.seconds)  # the span measured: the daemon idles through it
        cpu1, ctx1 = proc.cpu_times(), proc.num_ctx_switches()
        rss = proc.memory_info().rss / 2**20
        threads = len(proc.threads())
        busy = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
        wakeups = (ctx1.voluntary - ctx0.voluntary) + (ctx1.involuntary - ctx0.involuntary)
        subprocess.run(
            [sys.executable, "-m", "dflashd.supervisor", "stop", "--home", str(home)],
            capture_output=True,
            check=False,
        )
        daemon.wait(30)
        print(
            f"# idle_cost over {args.seconds:.0f}s (threads: {threads}, {len(threads0)} at start)"
        )
        print(f"RSS          {rss:.1f} MiB")
        print(f"CPU          {busy:.3f} s = {100 * busy / args.seconds:.4f} % of one core")
        print(f"ctx switches {wakeups} ({wakeups / args.seconds:.2f}/s)")


if __name__ == "__main__":
    main()
