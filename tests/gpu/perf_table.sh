#!/usr/bin/env bash
# Issue 53's table on the GPU machine's 16 cores (no GPU needed, only its cores): the log path
# side by side (direct, the lazy readers, supervisord 4.3 from .whl, dflashd zstd on / off /
# --quiet; blocks 256 MiB, lines 96 and 256 MiB, CPU per GiB, peak RSS, every byte checked),
# what a poll(2) on a pipe costs its writer, the writer's longest write at a rotation, the
# compression helper's cost, the log path's stages and the daemon's idle cost.
# Carry: .whl (orjson, zstandard, py-spy, structlog, supervisor wheels for Python 3.12).
# A 3-rep table on that host moves by a third between calls: tests/perf/tree_ab.py gives the
# paired figure of two trees.
set -uo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=tests/gpu/_env.sh
. tests/gpu/_env.sh
nproc
python3 tests/perf/side_by_side.py --modes block --mib 256 --reps 3 --wheels .whl --venv /tmp/sv 2>&1 | tee "$OUT/side_by_side_block.txt"
python3 tests/perf/side_by_side.py --modes line --mib 96 --reps 3 --wheels .whl --venv /tmp/sv 2>&1 | tee "$OUT/side_by_side_line96.txt"
python3 tests/perf/side_by_side.py --modes line --mib 256 --reps 3 --wheels .whl --venv /tmp/sv 2>&1 | tee "$OUT/side_by_side_line256.txt"
python3 tests/perf/poll_cost.py --mib 96 --rounds 6 2>&1 | tee "$OUT/poll_cost.txt"
python3 tests/perf/rotation_stall.py --dir /tmp 2>&1 | tee "$OUT/rotation_stall.txt"
python3 tests/perf/compress_cost.py --mib 512 --reps 2 2>&1 | tee "$OUT/compress_cost.txt"
python3 tests/perf/stage_cost.py --mib 256 2>&1 | tee "$OUT/stage_cost.txt"
python3 tests/perf/idle_cost.py --seconds 10 2>&1 | tee "$OUT/idle_cost.txt"
