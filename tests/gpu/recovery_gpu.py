"""Issue 51 on the H200, in one call: hang -> decided and hang -> next step for dflashd with no
config (the quick look), median of ``--runs``; the 150 s evaluation at full GPU utilisation
still left alone; the pre-flight's real NVML reads of every GPU (each field, and their cost).

    python3 tests/gpu/recovery_gpu.py [--runs 3] [--no-eval]   (after tests/gpu/_env.sh)

The job is tests/gpu/hang_gpu.py's (~25 ms a step of matmuls, a checkpoint every 50 steps,
frozen on a lock at step 150 while the GPU idles).  torchrun alone never decides a hang (it has
no hang detection): its row is "never" by construction and is not run here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.gpu.hang_gpu import run_case


def health_reads() -> dict[str, object]:
    """Every GPU's pre-flight reads through the real NVML, and what they cost."""
    import pynvml

    from dflashd.supervisor.model.preflight import preflight
    from dflashd.supervisor.watch.gpuhealth import read_health

    pynvml.nvmlInit()
    try:
        count = pynvml.nvmlDeviceGetCount()
        began = time.perf_counter()
        found = [read_health(pynvml, i) for i in range(count)]
        took_ms = (time.perf_counter() - began) * 1000
        costs = []
        for _ in range(20):
            began = time.perf_counter()
            read_health(pynvml, 0)
            costs.append((time.perf_counter() - began) * 1000)
    finally:
        pynvml.nvmlShutdown()
    checked = preflight(found, {}, {}, allowed=None, fallback=False)
    return {
        "gpus": [h.__repr__() for h in found],
        "first_read_all_ms": round(took_ms, 2),
        "one_gpu_median_ms": round(statistics.median(costs), 3),
        "healthy_pass": checked.ok,
        "notes": list(checked.notes),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-eval", action="store_true")
    args = parser.parse_args()
    health = health_reads()
    print(json.dumps(health, indent=1), flush=True)
    work = Path(tempfile.mkdtemp(prefix="dflashd-recovery-gpu-"))
    decided, next_step = [], []
    for i in range(args.runs):
        (work / f"run{i}").mkdir()
        found = run_case("freeze", work / f"run{i}")
        print(json.dumps(found, indent=1), flush=True)
        if found["hung_after_s"] is not None:
            decided.append(float(found["hung_after_s"]))
        if found.get("kill_to_next_step_s") is not None and found["hung_after_s"] is not None:
            next_step.append(float(found["hung_after_s"]) + float(found["kill_to_next_step_s"]))
    ok = {
        "pre-flight passes a healthy GPU": bool(health["healthy_pass"]),
        "pre-flight reads under 50 ms": float(health["first_read_all_ms"]) < 50,  # type: ignore[arg-type]
        "hang -> decided <= 10 s (median)": bool(decided) and statistics.median(decided) <= 10,
    }
    print("\n| | torchrun --max-restarts 3 | dflashd, no config |\n|---|---|---|")
    if decided:
        print(
            f"| hang -> decided (median of {len(decided)}) | never | {statistics.median(decided):.1f} s |"
        )
    if next_step:
        print(f"| hang -> next training step | never | {statistics.median(next_step):.1f} s |")
    if not args.no_eval:
        (work / "eval").mkdir()
        evaluated = run_case("eval", work / "eval")
        print(json.dumps(evaluated, indent=1), flush=True)
        ok["150 s eval at full utilisation not ended"] = evaluated["verdicts"] == [
            ("completed", "exit_code_0")
        ]
    for what, good in ok.items():
        print(f"{what}: {good}")
    return 0 if all(ok.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
