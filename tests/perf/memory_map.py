"""Where the daemon's memory is (issue 53): its resident set by mapping, at rest and at the peak
of a flood, read from ``/proc/PID/smaps`` every 20 ms.

The C allocator gives each thread that allocates its own arena (a 64 MiB reservation that grows
in place): a flood's buffers show as those arenas growing, apart from the main heap and the
interpreter's own 1 MiB pieces.  Which arena is which thread's is found by changing one bound
and watching which one moves (docs/measurements.md).

    python tests/perf/memory_map.py [--mode block|line] [--mib 256] [--flags --quiet]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from _bench import daemon_argv

WRITER = Path(__file__).with_name("_writer_child.py")


@dataclass(frozen=True)
class Mapping:
    size_kib: int
    perms: str
    name: str
    rss_kib: int


def mappings(pid: int) -> list[Mapping]:
    found: list[Mapping] = []
    head: list[str] | None = None
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and ":" not in fields[0]:
            head = fields
        elif fields[0] == "Rss:" and head is not None:
            low, high = (int(x, 16) for x in head[0].split("-"))
            name = head[5] if len(head) > 5 else "[anon]"
            found.append(Mapping((high - low) // 1024, head[1], name, int(fields[1])))
    return found


def show(label: str, maps: list[Mapping]) -> None:
    anon = [m for m in maps if m.name in ("[anon]", "[heap]")]
    files = sum(m.rss_kib for m in maps if m not in anon)
    total = sum(m.rss_kib for m in maps)
    print(f"{label}: {total / 1024:.1f} MiB resident, of which files {files / 1024:.1f} MiB")
    for m in sorted(anon, key=lambda m: -m.rss_kib)[:8]:
        print(f"  {m.rss_kib / 1024:6.2f} MiB of {m.size_kib / 1024:6.2f} MiB {m.perms} {m.name}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", default="block", choices=("block", "line"))
    parser.add_argument("--mib", type=float, default=256)
    parser.add_argument("--flags", default="--quiet", help="comma-separated start flags")
    parser.add_argument("--compress", default="false")
    args = parser.parse_args()
    flags = tuple(f for f in args.flags.split(",") if f)
    with tempfile.TemporaryDirectory(prefix="dflashd-mem-") as tmp:
        home, config, report = Path(tmp) / "home", Path(tmp) / "d.toml", Path(tmp) / "r.json"
        config.write_text(
            f'gpus = "none"\n[restart]\nearly_retries = 0\n[logs]\ncompress = {args.compress}\n'
        )
        child = [sys.executable, str(WRITER), args.mode, str(args.mib), str(report)]
        # the child waits for its go (a file) so the rest is read before the flood
        go = Path(tmp) / "go"
        waiting = ["sh", "-c", f'while [ ! -e "{go}" ]; do sleep 0.05; done; exec "$@"', "sh"]
        with open(Path(tmp) / "echo.txt", "wb") as echo:
            proc = subprocess.Popen(
                daemon_argv(home, config, waiting + child, flags=flags),
                stdout=echo,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(3.0)  # start-up done: the daemon at rest, its child waiting for the go
            show("at rest", mappings(proc.pid))
            go.touch()
            peak: tuple[int, list[Mapping]] = (0, [])
            deadline = time.monotonic() + 300
            while not report.exists() and time.monotonic() < deadline:
                maps = mappings(proc.pid)
                total = sum(m.rss_kib for m in maps)
                if total > peak[0]:
                    peak = (total, maps)
                time.sleep(0.02)  # a sampling pace: smaps read while the flood runs
            hwm = next(
                line.split()[1]
                for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
                if line.startswith("VmHWM:")
            )
            proc.terminate()
            proc.wait(30)
    show(f"{args.mode} flood's sampled peak (VmHWM {int(hwm) / 1024:.1f} MiB)", peak[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
