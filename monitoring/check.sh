#!/bin/sh
# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
# Checks the monitoring files with promtool (Debian's prometheus package): the alerting rules
# parse and pass their unit tests on synthetic series, and every query of the Grafana dashboard
# parses as PromQL (its variables replaced by what Grafana would put there).
#   monitoring/check.sh            (ctest: monitoring_rules, label unit)
set -eu
cd "$(dirname "$0")"
command -v promtool >/dev/null ||
    { echo "check: no promtool; packaging/setup-deps.sh installs Debian's prometheus" >&2; exit 1; }
promtool check rules mpsteer.rules.yml
promtool test rules mpsteer.rules.test.yml
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The dashboard's queries as recording rules: promtool check rules parses each expression.
python3 - mpsteer-dashboard.json >"$tmp/dashboard.rules.yml" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
exprs = [(p["title"], t["expr"]) for p in d["panels"] for t in p["targets"]]
exprs += [(v["name"], v["query"].replace("label_values(", "").rsplit(",", 1)[0])
          for v in d["templating"]["list"] if v["type"] == "query"]
grafana = {"$job": ".*", "$instance": ".*", "$__rate_interval": "1m"}
print("groups:\n  - name: dashboard\n    rules:")
for i, (title, e) in enumerate(exprs):
    for k, v in grafana.items():
        e = e.replace(k, v)
    print(f"      - record: dashboard:query{i}\n        expr: {json.dumps(e)}")
print(f"{len(exprs)} dashboard queries", file=sys.stderr)
PY
promtool check rules "$tmp/dashboard.rules.yml"
echo "check: rules, rule tests and dashboard queries pass"
