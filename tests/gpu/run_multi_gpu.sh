#!/usr/bin/env bash
# Issue 8 in one call, on a host with 2+ GPUs: NVML sampler cost per GPU, then tests/gpu/multi_gpu.py.
set -uo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=tests/gpu/_env.sh
. tests/gpu/_env.sh
nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv | tee "$OUT/nvidia_smi.txt"
python3 -c '
import statistics, subprocess, sys, time
from dflashd.supervisor.watch.nvml import NvmlSampler, gpu_pids_of_run, join_with_tree
s = NvmlSampler("all"); p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
costs = []
for _ in range(2000):
    t = time.perf_counter(); r = s.sample(); join_with_tree(r, gpu_pids_of_run(r, p.pid, set()), {}); costs.append((time.perf_counter() - t) * 1000)
p.kill(); costs.sort(); n = len(s.sample())
print(f"sampler with join: {n} GPUs, median {statistics.median(costs):.4f} ms/poll = {statistics.median(costs) / n:.4f} ms/GPU, p99 {costs[1979]:.4f} ms")
' 2>&1 | tee "$OUT/sampler.txt"
python3 tests/gpu/multi_gpu.py 2>&1 | tee "$OUT/multi_gpu.txt"
