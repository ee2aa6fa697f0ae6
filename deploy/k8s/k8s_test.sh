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
#   k8s_test.sh secrets    make-secrets.sh, offline into the test's directory:
#                          the certificates verify against its CA for the
#                          Service's DNS names, a real zenflowd serves TLS with
#                          them and its admin token, and an overlay rendered
#                          with secrets.yaml passes check_rendered.py (and the
#                          schemas) with the Secrets the pod projects.
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

mode=${1:?usage: k8s_test.sh sync|manifests|secrets}
if [ -n "${TEST_SRCDIR:-}" ]; then
  here="$TEST_SRCDIR/$TEST_WORKSPACE/deploy/k8s"
else
  here="$(cd "$(dirname "$0")" && pwd)"  # run by hand
fi
src=$(cd "$(dirname "$(readlink -f "$here/sync_rules.py")")/../.." && pwd)
# The measured checkpoint write rate the stop timeouts follow from.
checkpoint_json="$here/../../bench-results/checkpoint.json"
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
    --containerfile "$here/../container/Containerfile" --checkpoint-json "$checkpoint_json")
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
  # The stop timeout, the namespace and the admin token.
  sed 's/terminationGracePeriodSeconds: 300/terminationGracePeriodSeconds: 30/' \
    "$tmp/rendered/production.yaml" >"$tmp/bad/production.yaml"
  expect_fail "manifests: check_rendered on production's grace period of 30 s" \
    "terminationGracePeriodSeconds 30 is shorter than the 270 s" "${check[@]}" "$tmp/bad/production.yaml"
  python3 - "$tmp/rendered/single-node.yaml" "$tmp/bad/single-node.yaml" <<'PY'
import sys, yaml
objs = [o for o in yaml.safe_load_all(open(sys.argv[1])) if o and o["kind"] != "Namespace"]
yaml.safe_dump_all(objs, open(sys.argv[2], "w"))
PY
  expect_fail "manifests: check_rendered without the Namespace" "expected one Namespace, found 0" \
    "${check[@]}" "$tmp/bad/single-node.yaml"
  sed '/--admin_token_file=/d' "$tmp/rendered/single-node.yaml" >"$tmp/bad/single-node.yaml"
  expect_fail "manifests: check_rendered without --admin_token_file" "no --admin_token_file" \
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

# The Secrets of make-secrets.sh: made offline, checked with openssl and a
# real zenflowd, then rendered with an overlay (when kubectl is present).
test_secrets() {
  local make="$here/make-secrets.sh" s="$tmp/secrets"
  "$make" --namespace=zenflow --shards=2 --days=2 --out="$s" >"$tmp/out" 2>&1 ||
    { fail "secrets: make-secrets.sh: $(cat "$tmp/out")"; return 0; }
  local f
  for f in ca.crt ca.key server.crt server.key client.crt client.key admin.token secrets.yaml; do
    [ -s "$s/$f" ] || fail "secrets: no $s/$f"
  done
  for f in ca.key server.key client.key admin.token secrets.yaml; do
    [ "$(stat -c %a "$s/$f")" = 600 ] || fail "secrets: $f is mode $(stat -c %a "$s/$f"), want 600"
  done
  [ "$(ls -A "$s" | grep -c '^\.work')" = 0 ] || fail "secrets: the script left its scratch in $s"
  expect_fail "secrets: a second run into the same directory" "already holds a CA" \
    "$make" --out="$s"
  expect_fail "secrets: a bad namespace" "is not a Kubernetes namespace name" \
    "$make" --namespace=Zen_Flow --out="$tmp/unused"

  # The server certificate, for each name a rank's --target may use.
  local name
  for name in zenflowd-0.zenflowd zenflowd-1.zenflowd.zenflow zenflowd-1.zenflowd.zenflow.svc \
    zenflowd-0.zenflowd.zenflow.svc.cluster.local zenflowd-7.zenflowd.zenflow.svc.cluster.local; do
    openssl verify -CAfile "$s/ca.crt" -purpose sslserver -verify_hostname "$name" "$s/server.crt" \
      >"$tmp/out" 2>&1 || fail "secrets: server.crt does not verify for $name: $(cat "$tmp/out")"
  done
  expect_fail "secrets: server.crt for another namespace" "hostname mismatch" \
    openssl verify -CAfile "$s/ca.crt" -verify_hostname zenflowd-0.zenflowd.other.svc "$s/server.crt"
  openssl verify -CAfile "$s/ca.crt" -purpose sslclient "$s/client.crt" >"$tmp/out" 2>&1 ||
    fail "secrets: client.crt does not verify as a client: $(cat "$tmp/out")"
  expect_fail "secrets: client.crt as a server" "unsuitable certificate purpose" \
    openssl verify -CAfile "$s/ca.crt" -purpose sslserver "$s/client.crt"
  grep -qE '^[A-Za-z0-9_-]{43}$' "$s/admin.token" || fail "secrets: admin.token: $(cat "$s/admin.token")"
  "$make" --out="$tmp/secrets2" >/dev/null 2>&1 || fail "secrets: a second run into a new directory"
  cmp -s "$s/admin.token" "$tmp/secrets2/admin.token" && fail "secrets: two runs made the same admin token"

  # A real zenflowd serves TLS with client certificates with these files
  # and reads the admin token; a client with the worker's certificate
  # completes the handshake for a shard's name, and not for another's.
  local zenflowd="$src/bazel-bin/server/zenflowd"  # run by hand
  [ -z "${TEST_SRCDIR:-}" ] || zenflowd="$TEST_SRCDIR/$TEST_WORKSPACE/server/zenflowd"
  "$zenflowd" --listen=127.0.0.1:0 --port_file="$tmp/port" --tls_cert="$s/server.crt" \
    --tls_key="$s/server.key" --tls_ca="$s/ca.crt" --admin_token_file="$s/admin.token" \
    2>"$tmp/zenflowd.log" &
  local pid=$! port=""
  for _ in $(seq 1 300); do
    [ -s "$tmp/port" ] && { port=$(cat "$tmp/port"); break; }
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$port" ]; then
    fail "secrets: zenflowd did not start with the made files: $(cat "$tmp/zenflowd.log")"
  else
    local tls=(openssl s_client -connect "127.0.0.1:$port" -alpn h2 -CAfile "$s/ca.crt"
      -cert "$s/client.crt" -key "$s/client.key" -verify_return_error)
    "${tls[@]}" -verify_hostname zenflowd-0.zenflowd.zenflow.svc.cluster.local </dev/null \
      >"$tmp/out" 2>&1 || fail "secrets: TLS handshake with zenflowd failed: $(tail -20 "$tmp/out")"
    grep -qF "Verify return code: 0 (ok)" "$tmp/out" || fail "secrets: handshake not verified: $(tail -20 "$tmp/out")"
    expect_fail "secrets: a handshake for another namespace's name" "verify error" \
      "${tls[@]}" -verify_hostname zenflowd-0.zenflowd.other.svc.cluster.local
  fi
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true

  # Rendered with an overlay: the Secrets are in its namespace with the keys
  # the pod projects.
  local kubectl=${KUBECTL:-$(command -v kubectl || true)}
  if [ -z "$kubectl" ]; then
    notice "SKIPPED: rendering secrets.yaml with an overlay: no kubectl on PATH."
    skipped="no kubectl"
    return 0
  fi
  mkdir -p "$tmp/tree/site" "$tmp/with"
  cp -rL "$here/base" "$here/overlays" "$tmp/tree/"
  cp "$s/secrets.yaml" "$tmp/tree/site/"
  printf 'resources:\n  - ../overlays/single-node\n  - secrets.yaml\n' >"$tmp/tree/site/kustomization.yaml"
  "$kubectl" kustomize "$tmp/tree/site" >"$tmp/with/single-node.yaml" 2>"$tmp/err" ||
    { fail "secrets: kubectl kustomize with secrets.yaml: $(cat "$tmp/err")"; return 0; }
  local check=(python3 "$here/check_rendered.py" --containerfile "$here/../container/Containerfile"
    --checkpoint-json "$checkpoint_json")
  "${check[@]}" --json-dir "$tmp/with-json" "$tmp/with/single-node.yaml" >"$tmp/out" 2>&1 ||
    fail "secrets: check_rendered.py with the Secrets: $(cat "$tmp/out")"
  local node_modules="$src/deploy/k8s/validate/node_modules"
  if [ -d "$node_modules/kubernetes-models" ] && command -v node >/dev/null; then
    env NODE_PATH="$node_modules" node "$here/validate/validate.cjs" "$tmp/with-json/single-node.json" \
      >"$tmp/out" 2>&1 || fail "secrets: validate.cjs on the Secrets: $(cat "$tmp/out")"
  fi
  mkdir -p "$tmp/bad"
  python3 - "$tmp/with/single-node.yaml" "$tmp/bad/single-node.yaml" <<'PY'
import sys, yaml
objs = [o for o in yaml.safe_load_all(open(sys.argv[1]))
        if o and not (o["kind"] == "Secret" and o["metadata"]["name"] == "zenflowd-admin-token")]
yaml.safe_dump_all(objs, open(sys.argv[2], "w"))
PY
  expect_fail "secrets: check_rendered without the admin token's Secret" \
    "projects Secret zenflowd-admin-token, which is not rendered" "${check[@]}" "$tmp/bad/single-node.yaml"
}

case "$mode" in
  sync) test_sync ;;
  manifests) test_manifests ;;
  secrets) test_secrets ;;
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
