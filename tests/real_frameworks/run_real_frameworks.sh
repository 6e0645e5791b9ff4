#!/usr/bin/env bash
# Real frameworks under dflashd with no config (issue 22), on CPU. Not part of CI: it needs
# lightning (with rich), transformers and accelerate in FWPY's environment, e.g.
#   python3 -m venv fw && fw/bin/pip install torch==2.13.0 'lightning==2.6.*' 'transformers==5.*' accelerate rich
#   FWPY=fw/bin/python bash tests/real_frameworks/run_real_frameworks.sh
set -uo pipefail
cd "$(dirname "$0")"
FWPY="${FWPY:?set FWPY to a python with lightning, rich and transformers}"
WORK="$(mktemp -d)"
echo 'gpus = "none"' > "$WORK/c.toml"
printf 'gpus = "none"\n[restart]\nruntime_retries = 0\nearly_retries = 0\n' > "$WORK/once.toml"
run() {  # name, config, job argv...
    local name=$1 cfg=$2; shift 2
    dflashd start --foreground --quiet --home "$WORK/$name" --config "$WORK/$cfg" -- "$@" >/dev/null 2>&1
    echo "== $name (rc $?)"
    dflashd tail --home "$WORK/$name" --src dflashd -n 200 | grep -E "first_step|progress|exit|fatal|restart" | cut -c1-220
}
run lightning_completes c.toml "$FWPY" lightning_job.py
run lightning_crash_at_20 once.toml "$FWPY" lightning_job.py 20
run hf_trainer once.toml "$FWPY" hf_job.py 40
echo "homes under $WORK"
