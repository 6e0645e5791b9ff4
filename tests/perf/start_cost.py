"""What a start costs (issue 53): the CPU of ``dflashd start --foreground`` running a job that
writes nothing, taken apart, beside supervisord's for the same job.

At the log benchmark's sizes a start is much of a flood's CPU per GiB (side_by_side.py prints
it as ``start``).  Each line here is a fresh interpreter's own CPU and that of what it waited
for (``wait4``), the median of ``--reps`` runs:

    interpreter      ``python -c pass``
    client loads     the ``dflashd`` command's modules (``__main__``'s prelude, the CLI)
    daemon loads     the daemon program's modules (its code cache on, structlog as it loads it)
    foreground start ``dflashd start --foreground --quiet -- true``: both programs (the command
                     execs the daemon), the job and what the daemon spawns, end to end
    ... no code cache the same with ``DFLASHD_NO_CODE_CACHE=1``: every dataclass's methods
                     compiled, as where the cache cannot be written (host/codecache.py)

then, where a venv with supervisord is at hand (side_by_side.py makes one), each launcher's own
CPU for that job as side_by_side.py measures it (``/proc``, until supervisord's log says the
job exited).  ``--why`` adds each program's slowest imports (``-X importtime``, cumulative).

    python tests/perf/start_cost.py [--reps 11] [--venv DIR [--wheels DIR]] [--why]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _bench import daemon_argv
from side_by_side import ensure_supervisord, run_one

CLIENT_LOADS = (
    "from dflashd.supervisor import hold_ctrl_c_while_loading\n"
    "from dflashd.supervisor.host import codecache\n"
    "codecache.install()\n"
    "import dflashd.supervisor.client.cli\n"
)
DAEMON_LOADS = (
    "from dflashd.supervisor.host import codecache\n"
    "codecache.install()\n"
    "import dflashd.supervisor.daemon\n"
    "from dflashd.supervisor.speak.diagnostics import _import_structlog\n"
    "_import_structlog()\n"
)


def environment() -> dict[str, str]:
    """This environment with bytecode kept (as CI runs the suite and a user's install is)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def cpu_ms(argv: list[str], env: dict[str, str]) -> float:
    """One run's CPU in ms: the process and every child it waited for."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _pid, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv[:4]} failed ({os.waitstatus_to_exitcode(status)})")
    return (usage.ru_utime + usage.ru_stime) * 1000


def foreground_argv(work: Path) -> list[str]:
    """The daemon in the foreground on a fresh home, running ``true``."""
    home, config = work / "home", work / "d.toml"
    shutil.rmtree(home, ignore_errors=True)
    config.write_text('gpus = "none"\n[restart]\nearly_retries = 0\n')
    return daemon_argv(home, config, ["true"])


def slowest_imports(argv: list[str], env: dict[str, str], top: int = 12) -> list[str]:
    """Each program's slowest imports by cumulative time: the interpreter's ``-X importtime``
    (both programs of a foreground start write it: the daemon inherits the variable)."""
    done = subprocess.run(
        argv, env={**env, "PYTHONPROFILEIMPORTTIME": "1"}, capture_output=True, text=True
    )
    programs: list[list[tuple[int, str]]] = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "[us]" in line:
            continue
        _self, cumulative, name = line[len("import time:") :].split("|")
        if name.strip() == "encodings" and name.startswith(" encodings"):
            programs.append([])  # a new interpreter's first import
        if programs:
            programs[-1].append((int(cumulative), name.rstrip()))
    shown = []
    for number, rows in enumerate(programs, 1):
        shown.append(f"  program {number}: {sum(c for c, n in rows if n[1] != ' ') / 1000:.1f} ms")
        shown += [f"    {c / 1000:6.1f} ms {n}" for c, n in sorted(rows, reverse=True)[:top]]
    return shown


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=11)
    parser.add_argument(
        "--venv", type=Path, default=Path(tempfile.gettempdir()) / "dflashd-bench-venv"
    )
    parser.add_argument("--wheels", type=Path, help="install supervisor from this folder, offline")
    parser.add_argument("--why", action="store_true", help="each program's slowest imports")
    args = parser.parse_args()
    env, python = environment(), sys.executable
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # side_by_side's runs too
    uncached = {**env, "DFLASHD_NO_CODE_CACHE": "1"}
    print(f"# start_cost: {args.reps} reps, medians, CPU ms; {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="dflashd-start-") as tmp:
        work = Path(tmp)
        phases = {
            "interpreter": lambda: [python, "-c", "pass"],
            "client loads": lambda: [python, "-c", CLIENT_LOADS],
            "daemon loads": lambda: [python, "-P", "-c", DAEMON_LOADS],
            "foreground start": lambda: foreground_argv(work),
            "... no code cache": lambda: foreground_argv(work),
        }
        for argv in phases.values():  # once each, off the clock: bytecode and code cache made
            cpu_ms(argv(), env)
        taken: dict[str, list[float]] = {name: [] for name in phases}
        for _ in range(args.reps):
            for name, argv in phases.items():  # interleaved: a slow minute weighs on all
                taken[name].append(cpu_ms(argv(), uncached if "no code" in name else env))
        for name, values in taken.items():
            print(f"{name:18s} {statistics.median(values):7.1f} ms   (min {min(values):.1f})")
        if ensure_supervisord(args.venv, args.wheels):
            print("# as side_by_side.py measures a launcher (its own CPU, from /proc):")
            for name in ("supervisord", "dflashd-plain"):
                used = [run_one(name, "line", 0, work, args.venv).cpu_s for _ in range(args.reps)]
                print(f"{name:18s} {1000 * statistics.median(used):7.1f} ms")
        if args.why:
            print("# slowest imports (cumulative, -X importtime) of a foreground start:")
            print("\n".join(slowest_imports(foreground_argv(work), env)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
