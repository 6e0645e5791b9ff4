#!/usr/bin/env bash
# Issue 15 in one call, on a host with 2 GPUs (device kind nvidia-h200-x2): two "nodes" on one
# host, one GPU each (CUDA_VISIBLE_DEVICES), one dflashd per node supervising torchrun with
# NCCL and flex compiled in every worker thread; a dead worker, then a dead agent; then the
# same trainer alone on one GPU for tokens/s against two nodes.  Figures: $OUT/two_nodes.json.
set -uo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=tests/gpu/_env.sh
. tests/gpu/_env.sh
nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv | tee "$OUT/nvidia_smi.txt"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())'
timeout "${TWO_NODES_TIMEOUT:-480}" python3 -m tests.multinode.two_nodes --workdir "$OUT/work" \
    --device cuda --checkpoint-every 50 --baseline-steps 300 -- --workers 1 --log-every 10 \
    > "$OUT/two_nodes.json" 2> >(tee "$OUT/two_nodes.err" >&2)
rc=$?
for node in node-a node-b; do  # the logs, flat (a timeout leaves the daemons running: stop them)
    python3 -m dflashd.supervisor tail --home "$OUT/work/$node" -n 400 > "$OUT/$node.tail.txt" 2>&1
    python3 -m dflashd.supervisor stop --home "$OUT/work/$node" --timeout 10 >/dev/null 2>&1
done
python3 - "$OUT/two_nodes.json" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
try:
    figures = json.loads(text)
except ValueError:
    print(text[-3000:]); sys.exit(0)
for name, status in figures.pop("status", {}).items():
    print(name, "run", status["run"], "gpus", [(g["index"], g.get("child_memory_mib")) for g in status["gpus"]],
          "elastic", {k: status["elastic"][k] for k in ("group_rank", "group_world_size", "rendezvous")})
print(json.dumps(figures, indent=1, default=str)[:6000])
PY
rm -rf "$OUT/work/node-a/cache" "$OUT/work/node-b/cache"
exit $rc
