"""Control socket under load (issue 21): the share of status calls answered.

A real daemon supervises a quiet job; CLIENTS threads each send REQUESTS status requests
through the real client (``control.request``), all at once.  Then CLI_PROCS real
``dflashd status`` processes start together (``xargs -P100`` as the issue ran it).

    python tests/perf/control_load.py [--clients 100] [--requests 100] [--cli 100]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _bench import cli, daemon_argv

from dflashd.logs import EventRecord, follow
from dflashd.supervisor.speak.control import ControlError, request


def wait_launched(home: Path) -> None:
    deadline = time.monotonic() + 30
    for record in follow(
        home / "logs", poll_s=0.02, should_stop=lambda: time.monotonic() > deadline
    ):
        if isinstance(record, EventRecord) and record.event == "launched":
            return
    raise SystemExit("the daemon never launched")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--cli", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        config = work / "c.toml"
        config.write_text('gpus = "none"\n')
        home = work / "home"
        job = [
            sys.executable,
            "-c",
            "import threading; print('up', flush=True); threading.Event().wait()",
        ]
        daemon = subprocess.Popen(
            daemon_argv(home, config, job), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            wait_launched(home)
            answered = refused = 0
            lock = threading.Lock()
            go = threading.Event()

            def client() -> None:
                nonlocal answered, refused
                go.wait()
                for _ in range(args.requests):
                    try:
                        ok = (
                            request(home / "control.sock", {"cmd": "status"}, timeout_s=30).get(
                                "state"
                            )
                            == "running"
                        )
                    except ControlError:
                        ok = False
                    with lock:
                        answered += ok
                        refused += not ok

            threads = [threading.Thread(target=client) for _ in range(args.clients)]
            for thread in threads:
                thread.start()
            started = time.perf_counter()
            go.set()
            for thread in threads:
                thread.join()
            elapsed = time.perf_counter() - started
            total = args.clients * args.requests
            procs = [
                subprocess.Popen(
                    cli(home, "status", "--json"),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for _ in range(args.cli)
            ]
            running = 0
            for proc in procs:
                out, _ = proc.communicate(timeout=120)
                running += (
                    proc.returncode == 0 and json.loads(out or "{}").get("state") == "running"
                )
            print(
                json.dumps(
                    {
                        "threads": args.clients,
                        "requests": total,
                        "answered": answered,
                        "share_answered": round(answered / total, 4),
                        "requests_per_s": round(total / elapsed),
                        "cli_processes": args.cli,
                        "cli_said_running": running,
                    },
                    indent=2,
                )
            )
        finally:
            subprocess.run(cli(home, "stop"), capture_output=True, check=False)
            daemon.wait(60)


if __name__ == "__main__":
    main()
