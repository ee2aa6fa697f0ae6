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
# the parsed JSON), which check.sh must fail, naming WANT on the copy's lines.
names=() wants=()
broken() {
  local name=$1 want=$2 edit=$3
  python3 -c "import json, sys
d = json.load(open(sys.argv[1]))
$edit
json.dump(d, open(sys.argv[2], 'w'), indent=2)" "$dashboard" "$tmp/$name.json"
  names+=("$name") wants+=("$want")
}
broken panel_key_misspelt "'\"gridPoss\"' does not exist" \
  'p = d["panels"][2]; p["gridPoss"] = p.pop("gridPos")'
broken unknown_top_key "'\"refreshInterval\"' does not exist" 'd["refreshInterval"] = "5s"'
broken wrong_type "not assignable to type 'number" 'd["schemaVersion"] = "39"'
broken thresholds_mode "not assignable to type '\"absolute\" | \"percentage\"'" \
  'next(p for p in d["panels"] if "thresholds" in p.get("fieldConfig", {}).get("defaults", {}))["fieldConfig"]["defaults"]["thresholds"]["mode"] = "absolut"'
broken panel_key_case "'\"gridpos\"' does not exist" 'd["panels"][0]["gridpos"] = d["panels"][0]["gridPos"]'
# One tsc run for all the copies (check.sh gives each its verdict).
files=()
for n in "${names[@]}"; do files+=("$tmp/$n.json"); done
"${check[@]}" "${files[@]}" >"$tmp/out" 2>&1 || true
for i in "${!names[@]}"; do
  f="$tmp/${names[$i]}"
  if ! grep -qF "FAIL: $f.json does not satisfy" "$tmp/out"; then
    echo "FAIL: ${names[$i]}: check.sh passed it"; failures=$((failures + 1))
  elif ! grep -F "$f.json(" "$tmp/out" | grep -qF -- "${wants[$i]}"; then
    echo "FAIL: ${names[$i]}: no '${wants[$i]}' on its lines in:"; cat "$tmp/out"; failures=$((failures + 1))
  else
    echo "ok  ${names[$i]} rejected: $(grep -F "$f.json(" "$tmp/out" | grep -m1 -F -- "${wants[$i]}" | sed "s|^$tmp/||" | cut -c1-150)"
  fi
done

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo PASS
