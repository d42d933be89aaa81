#!/bin/sh
# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
# `promtool check metrics` on the agent's real /metrics: the built agent runs the shipped
# policies (with their Lua hooks) in a network namespace of its own, with its own pin root and
# state directory, until Ready; then its 127.0.0.1:9477/metrics (inside the namespace) must pass
# promtool's exposition-format and naming lint, and hold every family the alerting rules and the
# dashboard use. Needs root (BPF, netns).
#   monitoring/check-metrics.sh [MPSTEER]     (ctest: monitoring_metrics_promtool, label e2e)
set -eu
cd "$(dirname "$0")/.."
MPSTEER=$(realpath "${1:-build/src/cli/mpsteer}")
command -v promtool >/dev/null ||
    { echo "check-metrics: no promtool; packaging/setup-deps.sh installs Debian's prometheus" >&2; exit 1; }
NS=mps-prom-$$
PINS=/sys/fs/bpf/mps-prom-$$
TMP=$(mktemp -d /tmp/mpsteer-metrics.XXXXXX)
cleanup() {
    [ -z "${agent:-}" ] || { kill "$agent" 2>/dev/null; wait "$agent" 2>/dev/null || true; }
    "$MPSTEER" reset --pin-root "$PINS" --state-dir "$TMP/state" >/dev/null 2>&1 || true
    ip netns del "$NS" 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT INT TERM
# The repository as git-sync publishes it: the manifests at the root, their scripts in lua/.
mkdir -p "$TMP/repo"
cp -r policies/. "$TMP/repo/"
cp -r lua "$TMP/repo/lua"
ip netns add "$NS"
ip -n "$NS" link add mpsm0 type veth peer name mpsm1
for l in lo mpsm0 mpsm1; do ip -n "$NS" link set "$l" up; done
"$MPSTEER" run --policies "$TMP/repo" --netns "$NS" --pin-root "$PINS" --state-dir "$TMP/state" \
    --metrics-port 9477 >"$TMP/agent.log" 2>&1 &
agent=$!
scrape() {
    ip netns exec "$NS" python3 -c \
        'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:9477/metrics", timeout=5).read().decode(), end="")'
}
for _ in $(seq 100); do
    scrape 2>/dev/null | grep -qx "mpsteer_ready 1" && break
    sleep 0.2
done
scrape >"$TMP/metrics" || { tail -20 "$TMP/agent.log"; echo "check-metrics: no /metrics"; exit 1; }
grep -qx "mpsteer_ready 1" "$TMP/metrics" ||
    { tail -20 "$TMP/agent.log"; echo "check-metrics: the agent did not get Ready"; exit 1; }
echo "check-metrics: $(grep -c '^mpsteer_' "$TMP/metrics") series in $(grep -c '^# TYPE' "$TMP/metrics") families"
fail=0
# Lint problems are printed and fail the check (promtool exits 3 for lint, 1 for format errors).
promtool check metrics <"$TMP/metrics" || fail=1
# Every family an alerting rule or the dashboard names (a histogram's _bucket, _sum and _count
# are its family's), and the ones the status page's readers rely on.
used=$(grep -oh 'mpsteer_[a-z0-9_]*' monitoring/mpsteer.rules.yml monitoring/mpsteer-dashboard.json |
       sed -E 's/_(bucket|sum|count)$//' | sort -u)
for family in $used mpsteer_generation mpsteer_table_entries; do
    grep -q "^# TYPE $family " "$TMP/metrics" ||
        { echo "check-metrics: no $family (an alerting rule or the dashboard uses it)"; fail=1; }
done
[ "$fail" = 0 ] && echo "check-metrics: promtool check metrics passes on the agent's /metrics"
exit "$fail"
