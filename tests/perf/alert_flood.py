"""Does a hung webhook slow the job? (issue 6)

Run 1 of the child dies at once, so an alert goes to a webhook on loopback that never answers;
run 2 then prints LINES lines as fast as it can.  The child's own lines/s in run 2 is compared
with the same run under a daemon with no webhook at all, REPS times each, medians.

    python tests/perf/alert_flood.py [--lines 500000] [--reps 3]
"""

from __future__ import annotations

import argparse
import http.server
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from _bench import daemon_argv

CHILD = Path(__file__).resolve().parent.parent / "children" / "crash_then_flood.py"


def hanging_server() -> tuple[http.server.ThreadingHTTPServer, threading.Event]:
    release = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            release.wait(120)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, release


def one_run(work: Path, lines: int, webhook: str) -> float:
    home = work / "home"
    subprocess.run(["rm", "-rf", str(home)], check=True)
    config = work / "c.toml"
    alerts = f'[alerts]\nwebhook_url = "{webhook}"\n' if webhook else ""
    config.write_text(
        f'gpus = "none"\n[restart]\nearly_retries = 1\nbackoff_initial_s = 0.0\n{alerts}'
    )
    rate = work / "rate"
    argv = daemon_argv(home, config, [sys.executable, str(CHILD), str(lines), str(rate)])
    subprocess.run(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=600
    )
    return float(rate.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lines", type=int, default=500_000)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    server, release = hanging_server()
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    plain, hung = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.reps):
            plain.append(one_run(Path(tmp), args.lines, ""))
            hung.append(one_run(Path(tmp), args.lines, url))
    release.set()
    server.shutdown()
    p, h = statistics.median(plain), statistics.median(hung)
    print(f"# alert_flood: {args.lines:,} lines, {args.reps} reps, child's lines/s (median)")
    print(f"no webhook      {p:12,.0f}  {[round(x) for x in plain]}")
    print(f"hung webhook    {h:12,.0f}  {[round(x) for x in hung]}")
    print(f"ratio           {h / p:12.3f}")


if __name__ == "__main__":
    main()
