"""Two trees of dflashd on the same flood, interleaved round by round with supervisord (issue 53):
which change moved the log path's rate, on a box whose speed moves between runs.

Each round runs the old tree, this checkout, then supervisord, on the same bytes; the medians
and each tree's ratio to supervisord's median are printed.  OLD_TREE is a directory holding
another commit (``git archive REV | tar -x -C OLD_TREE``); its C loops are built there first
where they are missing.

    python tests/perf/tree_ab.py OLD_TREE [--modes block] [--mib 32] [--rounds 10]
        [--variant dflashd-plain] [--no-peer]

With ``--no-peer`` the ratios are to the old tree's median (supervisord is not run).  The
round-by-round ratio of the two trees is printed too: a paired figure, steadier than the ratio
of two medians on a box whose speed moves between rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import side_by_side as sbs

HERE = Path(__file__).resolve().parents[2]


def site_for(tree: Path, where: Path) -> Path:
    """A folder to put on PYTHONPATH that imports ``dflashd`` from ``tree`` (a namespace package:
    its three folders linked under one ``dflashd``, as the wheel installs them)."""
    if not list((tree / "logs").glob("_lines.cpython-*.so")):
        build = ["setup.py", "-q", "build_ext", "--inplace", "--build-temp", str(where / "b")]
        subprocess.run([sys.executable, *build], cwd=tree, check=False, capture_output=True)
    (where / "dflashd").mkdir(parents=True)
    for package in ("supervisor", "trainer", "logs"):
        (where / "dflashd" / package).symlink_to(tree / package)
    return where


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("old_tree", type=Path)
    parser.add_argument("--modes", default="block")
    parser.add_argument("--mib", type=float, default=32)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--variant", default="dflashd-plain", choices=sorted(sbs.DFLASHD_VARIANTS))
    parser.add_argument(
        "--venv", type=Path, default=Path(tempfile.gettempdir()) / "dflashd-bench-venv"
    )
    parser.add_argument("--wheels", type=Path, help="install supervisor from this folder, offline")
    parser.add_argument(
        "--no-peer", action="store_true", help="the two trees only (paired ratios, no supervisord)"
    )
    args = parser.parse_args()
    if not args.no_peer and not sbs.ensure_supervisord(args.venv, args.wheels):
        raise SystemExit("supervisord could not be installed: no peer to compare with")
    with tempfile.TemporaryDirectory(prefix="dflashd-ab-") as tmp:
        work = Path(tmp)
        sites = {
            "old": site_for(args.old_tree.resolve(), work / "old"),
            "new": site_for(HERE, work / "new"),
        }
        kept = os.environ.get("PYTHONPATH")
        for mode in args.modes.split(","):
            got: dict[str, list[sbs.Result]] = {"old": [], "new": [], "supervisord": []}
            for round_no in range(args.rounds):
                # each tree first in every other round; every run starts with the last one's
                # dirty pages written back (side_by_side.run_one)
                for name in ("old", "new") if round_no % 2 == 0 else ("new", "old"):
                    # the tree first; what was on the path stays behind it (the GPU host's wheels)
                    site = sites[name]
                    os.environ["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [kept])])
                    got[name].append(sbs.run_one(args.variant, mode, args.mib, work, args.venv))
                os.environ.pop("PYTHONPATH", None)  # supervisord's own package, not ours
                if not args.no_peer:
                    got["supervisord"].append(
                        sbs.run_one("supervisord", mode, args.mib, work, args.venv)
                    )
                if kept is not None:
                    os.environ["PYTHONPATH"] = kept
            if args.no_peer:
                got.pop("supervisord")
            peers = got.get("supervisord") or got["old"]
            peer = statistics.median(r.mib_s for r in peers)
            paired = [n.mib_s / o.mib_s for n, o in zip(got["new"], got["old"], strict=True)]
            against = "old" if args.no_peer else "supervisord"
            print(f"## {mode}, {args.mib:g} MiB, {args.rounds} rounds, {args.variant}")
            for name, results in got.items():
                rates = [r.mib_s for r in results]
                shares = [r.echoed for r in results if r.echoed is not None]
                echoed = f"   echoed {100 * statistics.median(shares):5.1f} %" if shares else ""
                print(
                    f"{name:12s} {statistics.median(rates):8.1f} MiB/s  "
                    f"{statistics.median(rates) / peer:5.2f}x {against}   "
                    f"CPU {statistics.median(r.cpu_s_per_gib for r in results):5.1f} s/GiB   "
                    f"peak RSS {max(r.peak_rss_mib for r in results):5.1f} MiB   "
                    f"each {[round(x) for x in rates]}"
                    + ("   bytes MISMATCH" if any(r.mismatch for r in results) else "   bytes ok")
                    + echoed
                )
            print(
                f"new / old, round by round: median {statistics.median(paired):.3f}, "
                f"{sum(p > 1 for p in paired)} of {len(paired)} rounds faster"
            )
    for mismatch in sbs.MISMATCHES:
        print(f"BYTES LOST {mismatch}")
    return 1 if sbs.MISMATCHES else 0


if __name__ == "__main__":
    sys.exit(main())
