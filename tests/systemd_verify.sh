#!/usr/bin/env bash
# systemd-analyze verify on the units, with ExecStart pointed at the dflashd that is installed
# here (verify insists that the binary exists).
set -euo pipefail
cd "$(dirname "$0")/.."
DFLASHD="$(command -v dflashd)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
for unit in systemd/dflashd.service 'systemd/dflashd@.service'; do
    sed "s#/opt/dflashd/bin/dflashd#$DFLASHD#" "$unit" > "$WORK/$(basename "$unit")"
done
cp "$WORK/dflashd@.service" "$WORK/dflashd@demo.service"
out="$(systemd-analyze verify "$WORK/dflashd.service" "$WORK/dflashd@demo.service" 2>&1 || true)"
# Complaints about the host (no such user here, no unit files of other packages) are not the unit's.
problems="$(printf '%s\n' "$out" | grep -v -E "^$|nvidia-persistenced|network-online|User .* not found|Failed to resolve user|dflashd: No such|Unknown user" || true)"
if [ -n "$problems" ]; then
    printf 'systemd-analyze verify:\n%s\n' "$out"
    exit 1
fi
echo "systemd units verified"
