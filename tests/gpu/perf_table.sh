#!/usr/bin/env bash
# Issue 26's table on the GPU machine's 16 cores (no GPU needed, only its cores): the log path
# side by side (direct, supervisord 4.3 from .bench/wheels, dflashd zstd on / off / --quiet),
# the compression helper's cost, the log path's stages, the daemon's idle cost.
# Carry: .whl (orjson, zstandard, py-spy for Python 3.12), .bench/wheels (supervisor), and
# logs/_lines.cpython-312-x86_64-linux-gnu.so where it was built here (else _env.sh builds it).
set -uo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=tests/gpu/_env.sh
. tests/gpu/_env.sh
nproc
python3 tests/perf/side_by_side.py --modes block --mib 512 --reps 3 --wheels .bench/wheels --venv /tmp/sv 2>&1 | tee "$OUT/side_by_side_block.txt"
python3 tests/perf/side_by_side.py --modes line --mib 128 --reps 3 --wheels .bench/wheels --venv /tmp/sv 2>&1 | tee "$OUT/side_by_side_line.txt"
python3 tests/perf/compress_cost.py --mib 512 --reps 2 2>&1 | tee "$OUT/compress_cost.txt"
python3 tests/perf/stage_cost.py --mib 256 2>&1 | tee "$OUT/stage_cost.txt"
python3 tests/perf/idle_cost.py --seconds 10 2>&1 | tee "$OUT/idle_cost.txt"
