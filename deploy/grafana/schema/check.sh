#!/usr/bin/env bash
# Checks a Grafana dashboard JSON (default: deploy/grafana/zenflow.json)
# against Grafana's own dashboard types, from the npm package @grafana/schema
# (the version pinned in package.json / package-lock.json here; 11.0.x, the
# schema of Grafana 11.0, whose dashboards are schemaVersion 39):
#
#   import type { Dashboard } from '@grafana/schema';
#   export const dashboard = (<the JSON>) satisfies Json<Dashboard>;
#
# compiled with tsc --noEmit --strict. `satisfies` on an object literal makes
# TypeScript check every key it holds: an unknown or misspelt key, a value of
# the wrong type or a missing required key fails, with the JSON's path in the
# error. Needs node and node_modules/ beside this script (./zf setup runs
# npm ci here).
#
#   check.sh [DASHBOARD.json...] [--node_modules=DIR]
#
# Several dashboards are compiled in one tsc run; each gets its own verdict
# line, and the exit status is 1 when any fails.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dashboards=()
modules="$here/node_modules"
for a in "$@"; do
  case "$a" in
    --node_modules=*) modules="${a#*=}" ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "check.sh: unknown flag '$a'" >&2; exit 2 ;;
    *) dashboards+=("$a") ;;
  esac
done
[ ${#dashboards[@]} -gt 0 ] || dashboards=("$here/../zenflow.json")
command -v node >/dev/null || { echo "check.sh: no node on PATH (./zf setup installs nodejs)" >&2; exit 1; }
[ -x "$modules/typescript/bin/tsc" ] && [ -d "$modules/@grafana/schema" ] || {
  echo "check.sh: no $modules/@grafana/schema or typescript: run ./zf setup (npm ci in $here)" >&2; exit 1; }
tmp=$(mktemp -d "${TEST_TMPDIR:-${TMPDIR:-/tmp}}/grafana-schema.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
ln -s "$modules" "$tmp/node_modules"
# Line 1 holds the import, the JSON form of the type and the opening
# parenthesis, so line N + 1 of dN.ts is line N of the JSON. The JSON
# form: Grafana's types name some string values by TypeScript enums
# (MappingType.ValueToText is "value", ThresholdsMode.Absolute "absolute"),
# which a JSON string literal cannot be typed as; Json<T> is T with each
# string enum replaced by the union of its values, and otherwise the same
# keys, optional keys and value types.
json_t='type Json<T> = T extends string ? (string extends T ? string : `${T}`) : T extends number | boolean | null | undefined ? T : T extends (infer U)[] ? Json<U>[] : T extends object ? { [K in keyof T]: Json<T[K]> } : T;'
files=()
for i in "${!dashboards[@]}"; do
  {
    echo "import type { Dashboard } from '@grafana/schema'; $json_t export const dashboard = ("
    cat "${dashboards[$i]}"
    echo ') satisfies Json<Dashboard>;'
  } >"$tmp/d$i.ts"
  files+=("d$i.ts")
done
version=$(node -p "require('$modules/@grafana/schema/package.json').version")
rc=0
(cd "$tmp" && node "$modules/typescript/bin/tsc" --noEmit --strict --skipLibCheck \
  --target es2020 --module commonjs --moduleResolution node "${files[@]}") >"$tmp/out" 2>&1 || rc=$?
failed=0
for i in "${!dashboards[@]}"; do
  f=${dashboards[$i]}
  # tsc's positions, as the JSON's lines.
  awk -v f="$f" -v p="d$i.ts(" '
    index($0, p) == 1 {
      rest = substr($0, length(p) + 1); n = rest + 0
      print f "(" n - 1 substr(rest, index(rest, ","))
    }' "$tmp/out" >"$tmp/out$i"
  if [ -s "$tmp/out$i" ]; then
    cat "$tmp/out$i"
    echo "FAIL: $f does not satisfy @grafana/schema $version's Dashboard"
    failed=1
  else
    echo "ok: $f satisfies @grafana/schema $version's Dashboard (schemaVersion $(node -p "require('$(readlink -f "$f")').schemaVersion"))"
  fi
done
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
  cat "$tmp/out"  # tsc failed on something else (its options, the packages)
  exit 1
fi
exit "$failed"
