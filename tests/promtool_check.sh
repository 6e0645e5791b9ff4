#!/usr/bin/env bash
# promtool against dflashd: the alert rules file, and a real scrape of a running daemon.
# Needs promtool (Debian: apt-get install prometheus). Not part of CI (the package is ~19 MB);
# run by hand: bash tests/promtool_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
command -v promtool >/dev/null || { echo "promtool not found (apt-get install prometheus)"; exit 2; }
echo "== promtool check rules"
promtool check rules systemd/dflashd-alerts.rules.yml
echo "== promtool test rules (the job-wide rules on synthetic series)"
(cd tests/promtool && promtool test rules rules_test.yml)
echo "== promtool check config (the example scrape config)"
(cd systemd && promtool check config prometheus.example.yml)
work="$(mktemp -d)"
trap 'DFLASHD_HOME="$work/home" "$PY" -m dflashd.supervisor stop --timeout 2 >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
port="$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
printf 'gpus = "none"\nmetrics_listen = "127.0.0.1:%s"\n' "$port" > "$work/c.toml"
"$PY" -m dflashd.supervisor start --home "$work/home" --config "$work/c.toml" -- \
    "$PY" tests/children/prints_then_waits.py
echo "== promtool check metrics (a real scrape)"
"$PY" -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$port/metrics', timeout=5).read().decode(), end='')" \
    | tee "$work/scrape.txt" | promtool check metrics
grep -c '^dflashd_' "$work/scrape.txt" | sed 's/^/samples: /'
grep -E "^dflashd_(productive|lost|stopped|goodput)" "$work/scrape.txt" || true
