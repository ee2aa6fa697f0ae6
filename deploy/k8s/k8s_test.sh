#!/usr/bin/env bash
# Tests of deploy/k8s (BUILD.bazel runs this script twice, by mode):
#
#   k8s_test.sh sync       sync_rules.py on fixtures, then
#                          base/prometheusrule.yaml against deploy/prometheus/rules.yml
#   k8s_test.sh manifests  kubectl kustomize renders base and every overlay;
#                          check_rendered.py checks what the pieces must agree on
#                          (TLS included);
#                          validate/validate.cjs checks every object against the
#                          Kubernetes and prometheus-operator schemas (npm
#                          kubernetes-models); both must also reject broken copies.
#
# Two inputs are not Bazel-declared and are read from the source tree beside
# this script's own files: deploy/prometheus/rules.yml (written on another
# branch; no Bazel package of this branch owns it) and
# deploy/k8s/validate/node_modules (installed by ./zf setup with npm ci). The
# targets are tagged "external" so Bazel never serves a cached result.
# Missing kubectl skips the manifests test with a notice: it is not a Debian
# 12 package (Debian's kubernetes-client is kubectl 1.20, whose kustomize
# v2.0.3 cannot read these kustomization files); the development machines
# come with kubectl 1.32 (kustomize v5.5). Missing node_modules or node fails it:
# ./zf setup installs them.
set -euo pipefail

mode=${1:?usage: k8s_test.sh sync|manifests}
if [ -n "${TEST_SRCDIR:-}" ]; then
  here="$TEST_SRCDIR/$TEST_WORKSPACE/deploy/k8s"
else
  here="$(cd "$(dirname "$0")" && pwd)"  # run by hand
fi
src=$(cd "$(dirname "$(readlink -f "$here/sync_rules.py")")/../.." && pwd)
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/k8s_test.XXXXXX")
failures=0
skipped=""

fail() {
  echo "FAIL $*"
  failures=$((failures + 1))
}

notice() {
  printf '%s\n' "########################################################################" \
    "# $*" "########################################################################"
}

# expect_fail NAME PATTERN CMD...: CMD exits non-zero and prints PATTERN.
expect_fail() {
  local name=$1 pattern=$2
  shift 2
  if "$@" >"$tmp/out" 2>&1; then
    fail "$name: passed, want a failure"
  elif ! grep -qF -- "$pattern" "$tmp/out"; then
    fail "$name: no '$pattern' in: $(cat "$tmp/out")"
  fi
}

test_sync() {
  local sync="$here/sync_rules.py" f="$tmp/rules.yml" out="$tmp/pr.yaml"
  cat >"$f" <<'YAML'
groups:
  - name: g
    rules:
      - record: job:x:rate5m
        expr: sum by (job) (rate(x_total[5m]))
      - alert: A
        expr: |
          job:x:rate5m
            > 1
        for: 5m
        labels: {severity: warning}
        annotations: {description: "two\nlines"}
YAML
  python3 "$sync" --rules "$f" --out "$out" >/dev/null || fail "sync: generating from a fixture"
  python3 "$sync" --rules "$f" --out "$out" --check || fail "sync: --check right after generating"
  python3 - "$f" "$out" <<'PY' || fail "sync: generated groups differ from the fixture's"
import sys, yaml
rules, pr = (yaml.safe_load(open(p)) for p in sys.argv[1:])
assert pr["kind"] == "PrometheusRule" and pr["spec"]["groups"] == rules["groups"]
PY
  sed -i 's/for: 5m/for: 10m/' "$f"
  expect_fail "sync: --check after a rule changed" "differ from rules.yml" \
    python3 "$sync" --rules "$f" --out "$out" --check
  expect_fail "sync: a rule file with more than groups" "expected a mapping with 'groups' only" \
    python3 "$sync" --rules <(printf 'groups: []\nextra: 1\n') --out "$out"
  python3 "$sync" --rules <(sed 's/for: 10m/for: 5m/' "$f") --out "$tmp/with_groups.yaml" >/dev/null
  python3 "$sync" --rules "$tmp/absent.yml" --out "$out" >/dev/null 2>&1 ||
    fail "sync: generating without rules.yml"
  grep -q "groups: \[\]" "$out" || fail "sync: no empty groups without rules.yml"
  expect_fail "sync: absent rules.yml but a PrometheusRule with groups" "absent" \
    python3 "$sync" --rules "$tmp/absent.yml" --out "$tmp/with_groups.yaml" --check

  # The real pair.
  local rules="$src/deploy/prometheus/rules.yml"
  if [ ! -f "$rules" ]; then
    notice "SKIPPED: $rules does not exist, so base/prometheusrule.yaml" \
      "is only checked to carry no groups and the absent-rules marker."
  fi
  python3 "$sync" --rules "$rules" --out "$here/base/prometheusrule.yaml" --check ||
    fail "sync: base/prometheusrule.yaml is out of date with deploy/prometheus/rules.yml"
}

test_manifests() {
  local kubectl=${KUBECTL:-$(command -v kubectl || true)}
  if [ -z "$kubectl" ]; then
    notice "SKIPPED: no kubectl on PATH ($PATH), so nothing is rendered or validated." \
      "kubectl (with kustomize v5) is not a Debian 12 package; install one and rerun."
    skipped="no kubectl"
    return 0
  fi
  local node_modules="$src/deploy/k8s/validate/node_modules" schemas=1
  # The schema packages come from the npm registry (./zf setup runs npm ci);
  # on a machine that cannot reach it, rendering and the project's own
  # checks still run, and the schema check says it was skipped.
  if [ ! -d "$node_modules/kubernetes-models" ] || ! command -v node >/dev/null; then
    notice "SKIPPED: schema validation: no $node_modules/kubernetes-models or no node" \
      "(./zf setup installs them with npm ci when the npm registry is reachable)."
    skipped="no kubernetes-models schemas"
    schemas=0
  fi
  # Render from a plain copy of the declared files: kustomize refuses files
  # that are symlinks out of the kustomization's folder (runfiles are).
  mkdir -p "$tmp/tree" "$tmp/rendered"
  cp -rL "$here/base" "$here/overlays" "$tmp/tree/"
  local name
  for target in base overlays/single-node overlays/production; do
    name=$(basename "$target")
    "$kubectl" kustomize "$tmp/tree/$target" >"$tmp/rendered/$name.yaml" 2>"$tmp/err" ||
      fail "manifests: kubectl kustomize $target: $(cat "$tmp/err")"
  done
  [ "$failures" -eq 0 ] || return 0
  echo "rendered with $("$kubectl" version --client 2>/dev/null | tr '\n' ' ')"
  local check=(python3 "$here/check_rendered.py" --rules "$src/deploy/prometheus/rules.yml"
    --containerfile "$here/../container/Containerfile")
  "${check[@]}" --json-dir "$tmp/json" "$tmp"/rendered/*.yaml || fail "manifests: check_rendered.py"
  local validate=(env NODE_PATH="$node_modules" node "$here/validate/validate.cjs")
  if [ "$schemas" -eq 1 ]; then
    "${validate[@]}" "$tmp"/json/*.json || fail "manifests: validate.cjs"
  fi

  # Neither check passes a broken copy.
  mkdir -p "$tmp/bad"
  sed 's/value: 50052-50052/value: 50053-50053/' "$tmp/rendered/production.yaml" >"$tmp/bad/production.yaml"
  expect_fail "manifests: check_rendered on a moved UCX port" "containerPort ucx is 50052" \
    "${check[@]}" "$tmp/bad/production.yaml"
  sed 's/runAsUser: 10001/runAsUser: 0/' "$tmp/rendered/single-node.yaml" >"$tmp/bad/single-node.yaml"
  expect_fail "manifests: check_rendered on uid 0" "are not the Containerfile's USER" \
    "${check[@]}" "$tmp/bad/single-node.yaml"
  # TLS: gRPC without client certificates, probes on the TLS port, a key
  # readable by everyone.
  sed '/--tls_ca=/d' "$tmp/rendered/production.yaml" >"$tmp/bad/production.yaml"
  expect_fail "manifests: check_rendered without --tls_ca" "no --tls_ca" \
    "${check[@]}" "$tmp/bad/production.yaml"
  sed 's/port: 50053/port: 50051/' "$tmp/rendered/production.yaml" >"$tmp/bad/production.yaml"
  expect_fail "manifests: check_rendered on probes of the TLS port" \
    "readinessProbe is not a gRPC probe on the health port 50053" \
    "${check[@]}" "$tmp/bad/production.yaml"
  sed 's/defaultMode: 288/defaultMode: 420/' "$tmp/rendered/single-node.yaml" >"$tmp/bad/single-node.yaml"
  expect_fail "manifests: check_rendered on a world-readable key" \
    "--tls_key=/etc/zenflowd/tls/tls.key is readable by others (mode 644)" \
    "${check[@]}" "$tmp/bad/single-node.yaml"
  python3 - "$tmp/json/production.json" "$tmp/bad/broken.json" <<'PY'
import json, sys
objs = json.load(open(sys.argv[1]))
for o in objs:
    if o["kind"] == "StatefulSet":
        c = o["spec"]["template"]["spec"]["containers"][0]
        c["readinesProbe"] = c.pop("readinessProbe")  # a misspelt key
        c["ports"][0]["containerPort"] = "50051"      # a wrong type
    if o["kind"] == "ServiceMonitor":
        o["spec"]["endpoints"][0]["honourLabels"] = True
json.dump(objs, open(sys.argv[2], "w"))
PY
  [ "$schemas" -eq 1 ] || return 0
  "${validate[@]}" "$tmp/bad/broken.json" >"$tmp/out" 2>&1 && fail "validate.cjs passed a broken StatefulSet"
  for want in "containers/0/readinesProbe: not a field of the schema" \
    "containers/0/ports/0/containerPort: must be integer" \
    "endpoints/0/honourLabels: not a field of the schema"; do
    grep -qF -- "$want" "$tmp/out" || fail "validate.cjs did not report '$want': $(cat "$tmp/out")"
  done
}

case "$mode" in
  sync) test_sync ;;
  manifests) test_manifests ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac
rm -rf "$tmp"
if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
if [ -n "$skipped" ]; then
  echo "k8s_test $mode: SKIPPED ($skipped)"
else
  echo "k8s_test $mode: all checks passed"
fi
