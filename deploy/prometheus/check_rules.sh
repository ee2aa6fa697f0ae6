#!/usr/bin/env bash
# deploy:prometheus_rules_test: the alert rules, their tests, the example
# scrape config and the Grafana dashboard.
#  1. promtool: check rules.yml, run rules_test.yml (every alert firing and
#     not firing), check prometheus.yml (it loads rules.yml);
#  2. lint_monitoring.py: the dashboard's structure, and every metric and
#     label of the dashboard and the rules against deploy/METRICS_SPEC.md;
#  3. extract_queries.py prints every expression;
#  4. a real Prometheus, run with prometheus.yml's zenflowd scrape job, scrapes
#     a sample of zenflowd's /metrics (testdata/zenflowd_metrics.prom):
#     live_check.py checks the `job` label collision is handled (see the top
#     of rules.yml), and extract_queries.py runs every expression there
#     (each must parse and run; each dashboard query must return series) and
#     checks every rule evaluates without error.
# Needs promtool, prometheus (Debian: prometheus) and python3 with yaml
# (python3-yaml).
set -euo pipefail
export PYTHONDONTWRITEBYTECODE=1  # the scripts run from the source tree
if [ -n "${TEST_SRCDIR:-}" ]; then
  D="$TEST_SRCDIR/$TEST_WORKSPACE/deploy"
else
  D="$(cd "$(dirname "$0")/.." && pwd)"  # run by hand
fi
P="$D/prometheus"
dir=$(mktemp -d "${TEST_TMPDIR:-/tmp}/prometheus_rules.XXXXXX")

step() { printf '\n== %s\n' "$*"; }

step "promtool check rules"
promtool check rules "$P/rules.yml"
step "promtool test rules"
promtool test rules "$P/rules_test.yml"
step "promtool check config"
promtool check config "$P/prometheus.yml"

step "lint_monitoring.py"
python3 "$P/lint_monitoring.py"

step "extract_queries.py"
python3 "$P/extract_queries.py" > "$dir/queries.jsonl"
count=$(wc -l < "$dir/queries.jsonl")
echo "$count expressions"
# One JSON object a line, each with a source and a non-empty expression
# without Grafana variables left in it.
python3 - "$dir/queries.jsonl" <<'PY'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) >= 40, "only %d expressions" % len(lines)
for line in lines:
    q = json.loads(line)
    assert set(q) == {"source", "expr"} and q["source"] and q["expr"].strip(), line
    assert "$" not in q["expr"] and "[[" not in q["expr"] and "\n" not in q["expr"], line
PY

step "a real Prometheus scrapes a sample of zenflowd's /metrics"
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
mkdir -p "$dir/www" "$dir/data"
cp "$P/testdata/zenflowd_metrics.prom" "$dir/www/metrics"
cp "$P/rules.yml" "$dir/rules.yml"  # prometheus.yml loads it from beside itself
sample_port=$(free_port)
prom_port=$(free_port)
python3 -m http.server --bind 127.0.0.1 --directory "$dir/www" "$sample_port" >"$dir/sample.log" 2>&1 &
sample_pid=$!
prom_pid=""
stop() {
  [ -n "$prom_pid" ] && kill -TERM "$prom_pid" 2>/dev/null && wait "$prom_pid" 2>/dev/null || true
  kill -TERM "$sample_pid" 2>/dev/null && wait "$sample_pid" 2>/dev/null || true
}
trap stop EXIT
# The same sample as a second target (another name for the same address):
# the control scrape job, without honor_labels.
python3 "$P/live_check.py" config "$P/prometheus.yml" "127.0.0.1:$sample_port" "localhost:$sample_port" "$dir/prometheus.yml"
promtool check config "$dir/prometheus.yml" >/dev/null
prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/data" \
  --web.listen-address="127.0.0.1:$prom_port" --log.level=warn >"$dir/prometheus.log" 2>&1 &
prom_pid=$!
url="http://127.0.0.1:$prom_port"
if ! python3 "$P/live_check.py" check "$url" "127.0.0.1:$sample_port" "localhost:$sample_port"; then
  echo "--- prometheus log"; cat "$dir/prometheus.log"
  echo "--- sample server log"; cat "$dir/sample.log"
  exit 1
fi
step "every expression against it"
if ! python3 "$P/extract_queries.py" --prometheus "$url" > "$dir/live.jsonl"; then
  grep '"error"' "$dir/live.jsonl" || true
  exit 1
fi
echo "$(wc -l < "$dir/live.jsonl") queries ran and returned series, every rule is healthy"
stop
trap - EXIT
echo
echo "prometheus rules test passed"
