"""Issue 32's figures on this machine: hang -> decision over N runs, false kills over N pauses.

    python tests/perf/hang_table.py [--runs 10] [--pause 150]

Starts, side by side, N jobs that step every 0.1 s and then block forever on a lock, and N of
each pause of ``--pause`` seconds: writing a 200 MB checkpoint, an "eval" computing in a Python
loop, a data preparation (a ``multiprocessing.Pool`` computes while the main thread waits on
it) and a first compile (compile worker processes started for it, the main thread waiting on
their futures); each under its own daemon, no config.  Prints the decision times (median,
worst) and the false kills.  ``--kinds`` picks the pauses.  The eval jobs load the machine (2 cores here): the verdicts must
not depend on how much CPU each job gets.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHILD = ROOT / "tests" / "children" / "steps_then.py"
PAUSES = ("checkpoint", "eval", "dataprep", "compile")


def start(home: Path, config: Path, *job: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "dflashd.supervisor", "start", "--foreground", "--quiet"]
    argv += ["--home", str(home), "--config", str(config), "--", sys.executable, str(CHILD), *job]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def exits(home: Path) -> list[dict]:
    out = []
    for line in (home / "logs" / "dflashd.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("event") == "exit":
            out.append(rec)
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--pause", type=float, default=150.0)
    parser.add_argument("--kinds", default=",".join(PAUSES))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dflashd-hangs-"))
    config = work / "c.toml"
    config.write_text('gpus = "none"\n[restart]\nbackoff_initial_s = 0.0\n')
    procs: dict[str, list[tuple[Path, subprocess.Popen[bytes]]]] = {}
    pauses = [k for k in args.kinds.split(",") if k]
    for kind in ("lock", *pauses):
        for i in range(args.runs):
            home = work / f"{kind}-{i}"
            marker = str(work / f"{kind}-{i}.bin")
            job = ("0.1", "40", kind, str(args.pause), marker)
            procs.setdefault(kind, []).append((home, start(home, config, *job)))
    started = time.monotonic()
    for kind_procs in procs.values():
        for _, proc in kind_procs:
            proc.wait(args.pause + 600)
    hung = [exits(home)[0].get("hung_after_s") for home, _ in procs["lock"]]
    decided = [h for h in hung if h is not None]
    false_kills = {
        kind: sum(1 for home, _ in procs[kind] if exits(home)[0]["verdict"] != "completed")
        for kind in pauses
    }
    print(f"{args.runs} runs each, side by side, {time.monotonic() - started:.0f} s in all")
    print(
        f"hang -> decision: median {statistics.median(decided):.1f} s, worst {max(decided):.1f} s"
        f" ({len(decided)} of {len(hung)} ended as hung)"
    )
    for kind, count in false_kills.items():
        print(f"false kills, {args.pause:.0f} s {kind} pause: {count} of {args.runs}")
    return 0 if len(decided) == len(hung) and not any(false_kills.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
