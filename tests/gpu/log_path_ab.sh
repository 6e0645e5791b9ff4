#!/usr/bin/env bash
# The log path side by side (issue 53) for this tree and, when given, other trees (older commits,
# variants) in the same run on the same machine: which change moved the rates.  No GPU needed,
# only the host's cores.
#   tests/gpu/log_path_ab.sh [TREE ...]     (a TREE: e.g. `git archive REV | tar -x -C .old`)
#   LOG_PATH_MIB=256 LOG_PATH_MODES=block,line (the defaults)
# Carry: .whl (orjson, zstandard, py-spy, structlog, prometheus-client, supervisor 4.3 wheels)
# and each TREE.  Output: $OUT/side_by_side_<mode>_<tree>.txt.  The trees run one after the
# other; tests/perf/tree_ab.py TREE --wheels .whl interleaves two of them round by round.
set -uo pipefail
cd "$(dirname "$0")/../.."
here="$PWD"
wheels="$here/.whl"
OUT="${OUT:-$(mktemp -d)}"
export OUT
measure() {  # TREE
    (
        cd "$1" || exit 1
        label="$(basename "$PWD")"
        rm -f logs/_lines.cpython-3*.so  # built here, for this interpreter
        [ -e .whl ] || ln -s "$wheels" .whl
        # shellcheck source=tests/gpu/_env.sh
        . tests/gpu/_env.sh
        echo "== $label on $(nproc) cores"
        for mode in ${LOG_PATH_MODES:-block line}; do
            python3 tests/perf/side_by_side.py --modes "$mode" --mib "${LOG_PATH_MIB:-256}" \
                --reps 3 --wheels "$wheels" --venv /tmp/sv 2>&1 | tee "$OUT/side_by_side_${mode}_$label.txt"
        done
    )
}
# this tree first: its benchmark installs supervisord into /tmp/sv the way older ones could not
# (a checkout on PYTHONPATH has a folder named supervisor/ that hides supervisord's package)
measure "$here"
for tree in "$@"; do measure "$tree"; done
