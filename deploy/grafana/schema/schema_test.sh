#!/usr/bin/env bash
# deploy:grafana_schema_test: deploy/grafana/zenflow.json satisfies Grafana's
# dashboard types (check.sh: @grafana/schema + tsc --noEmit), and check.sh
# rejects broken copies of it: a misspelt key in a panel, an unknown key at
# the top, a wrong value type, and a thresholds mode that is not one of the
# schema's. node_modules/ (./zf setup: npm ci here) is not a Bazel input, so
# it is read from the source tree beside this script (the target is tagged
# "external"); missing, the test fails: ./zf setup installs it.
set -euo pipefail
if [ -n "${TEST_SRCDIR:-}" ]; then
  here="$TEST_SRCDIR/$TEST_WORKSPACE/deploy/grafana/schema"
else
  here="$(cd "$(dirname "$0")" && pwd)"  # run by hand
fi
src=$(cd "$(dirname "$(readlink -f "$here/check.sh")")" && pwd)
dashboard="$here/../zenflow.json"
check=("$here/check.sh" "--node_modules=$src/node_modules")
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/schema_test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
failures=0

"${check[@]}" "$dashboard" || { echo "FAIL: the dashboard does not pass"; failures=$((failures + 1)); }

# broken NAME WANT PYTHON: a copy of the dashboard changed by PYTHON (d is
# the parsed JSON) must fail check.sh, and its output must name WANT.
broken() {
  local name=$1 want=$2 edit=$3
  python3 -c "import json, sys
d = json.load(open(sys.argv[1]))
$edit
json.dump(d, open(sys.argv[2], 'w'), indent=2)" "$dashboard" "$tmp/$name.json"
  if "${check[@]}" "$tmp/$name.json" >"$tmp/$name.out" 2>&1; then
    echo "FAIL: $name: check.sh passed it"; failures=$((failures + 1))
  elif ! grep -qF -- "$want" "$tmp/$name.out"; then
    echo "FAIL: $name: no '$want' in:"; cat "$tmp/$name.out"; failures=$((failures + 1))
  else
    echo "ok  $name rejected: $(grep -m1 -F -- "$want" "$tmp/$name.out" | cut -c1-160)"
  fi
}
broken panel_key_misspelt "'\"gridPoss\"' does not exist" \
  'p = d["panels"][2]; p["gridPoss"] = p.pop("gridPos")'
broken unknown_top_key "'\"refreshInterval\"' does not exist" 'd["refreshInterval"] = "5s"'
broken wrong_type "not assignable to type 'number" 'd["schemaVersion"] = "39"'
broken thresholds_mode "not assignable to type '\"absolute\" | \"percentage\"'" \
  'next(p for p in d["panels"] if "thresholds" in p.get("fieldConfig", {}).get("defaults", {}))["fieldConfig"]["defaults"]["thresholds"]["mode"] = "absolut"'
broken panel_key_case "'\"gridpos\"' does not exist" 'd["panels"][0]["gridpos"] = d["panels"][0]["gridPos"]'

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo PASS
