#!/usr/bin/env bash
# Every GPU check in one call, on a machine with an NVIDIA GPU (the lent H200):
#   the gpu-marked pytest tests, tests/gpu/zero_config_gpu.py (a silent busy job, compile-time
#   utilisation, real Lightning and Hugging Face trainers), then tests/gpu/gpu_checks.py (sampler cost, memory release,
#   no_gpu_memory timing, relaunch, the trainer's flex path, supervised vs unsupervised), then
#   tests/gpu/custody_gpu.py (the trainer under each custody mode: SIGKILL, release, relaunch; an
#   escaped GPU holder ended at stop).
# Wheels for packages the machine lacks sit in .whl/ (see the device tool's README): orjson, zstandard,
# py-spy, prometheus-client and structlog for its Python 3.12 (`pip download --no-deps -d .whl ...`).
set -uo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=tests/gpu/_env.sh
. tests/gpu/_env.sh
nvidia-smi --query-gpu=index,name,memory.used,memory.total,driver_version --format=csv | tee "$OUT/nvidia_smi.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "gpus", torch.cuda.device_count())'
# -o addopts: the GPU machine has no pytest-xdist (the suite's -n 2); one GPU, one process
python3 -m pytest -o addopts="--strict-markers -ra" -m gpu tests/gpu -v -W default -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.txt"
python3 tests/gpu/zero_config_gpu.py 2>&1 | tee "$OUT/zero_config_gpu.txt"
python3 tests/gpu/gpu_checks.py 2>&1 | tee "$OUT/gpu_checks.txt"
python3 tests/gpu/custody_gpu.py 2>&1 | tee "$OUT/custody_gpu.txt"
python3 tests/gpu/stacks_gpu.py all 2>&1 | tee "$OUT/stacks_gpu.txt"
python3 tests/gpu/nanogpt_restart.py 2>&1 | tee "$OUT/nanogpt_restart.txt"  # needs .bench/nanogpt (see the script)
python3 tests/gpu/goodput_gpu.py 2>&1 | tee "$OUT/goodput_gpu_run.txt"
python3 tests/gpu/slow_gpu.py intruder 2>&1 | tee "$OUT/slow_gpu_intruder.txt"
python3 tests/gpu/slow_gpu.py clean 380 2>&1 | tee "$OUT/slow_gpu_clean.txt"
python3 tests/gpu/recovery_gpu.py --runs 3 2>&1 | tee "$OUT/recovery_gpu.txt"  # issue 51: quick look, pre-flight reads
python3 tests/gpu/kill_gpu.py --runs 3 2>&1 | tee "$OUT/kill_gpu.txt"  # issue 51: kill -> next step, warm standby
# issue 51's whole table beside the peers (torchrun; ft_launcher with heartbeat code, its wheel
# and its two pure-Python needs in .whl/peers/, installed only for this run)
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/peers/*.whl \
    && python3 tests/gpu/peers_gpu.py --runs 3 2>&1 | tee "$OUT/peers_gpu.txt"
