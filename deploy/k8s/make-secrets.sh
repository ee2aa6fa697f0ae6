#!/usr/bin/env bash
# Makes the Secrets the zenflowd pods need (deploy/k8s), with openssl alone:
#
#   zenflowd-tls           tls.crt, tls.key: the server certificate for the
#                          headless Service's DNS names; ca.crt: the CA that
#                          signed it and signs the ranks' client certificates
#   zenflowd-admin-token   admin.token: a random admin token (zenflowd
#                          --admin_token_file; zfctl/zf_stats --token_file)
#   zenflow-worker-tls     tls.crt, tls.key: a client certificate for the GPU
#                          workers (zf_train --tls_cert, --tls_key); ca.crt
#                          to check the server with (--tls_ca)
#
#   deploy/k8s/make-secrets.sh [--namespace=zenflow] [--shards=3]
#       [--cluster_domain=cluster.local] [--days=365] [--out=DIR] [--apply]
#
# Writes into DIR (default ./zenflow-secrets, made mode 0700): the CA and
# both key pairs as PEM files, admin.token, and secrets.yaml with the three
# Secret manifests. Nothing leaves the machine unless --apply is given: then
# `kubectl apply -f DIR/secrets.yaml` creates them in the namespace (which
# the overlay creates: apply it first). Refuses to overwrite a DIR that has
# a CA already, so a second run cannot replace certificates by accident.
#
# The server certificate names each shard as a rank's --target may:
# zenflowd-N.zenflowd (within the namespace), zenflowd-N.zenflowd.NAMESPACE,
# ...svc and ...svc.CLUSTER_DOMAIN for N below --shards, and the wildcards
# *.zenflowd.NAMESPACE.svc and *.zenflowd.NAMESPACE.svc.CLUSTER_DOMAIN (so a
# shard added later is covered by its full names). Keys are EC P-256. The CA
# key stays in DIR: keep it offline; it signs more worker certificates.
# docs/operating.md#kubernetes-step-by-step shows the whole sequence;
# //deploy/k8s:secrets_test runs this script and checks what it makes.
set -euo pipefail

namespace=zenflow shards=3 domain=cluster.local days=365 out=./zenflow-secrets apply=0
usage() { sed -n '2,/^set -euo/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'; }
for a in "$@"; do
  case "$a" in
    --namespace=*) namespace="${a#*=}" ;;
    --shards=*) shards="${a#*=}" ;;
    --cluster_domain=*) domain="${a#*=}" ;;
    --days=*) days="${a#*=}" ;;
    --out=*) out="${a#*=}" ;;
    --apply) apply=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "make-secrets: unknown argument '$a'" >&2; usage >&2; exit 2 ;;
  esac
done
if ! [[ "$namespace" =~ ^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$ ]]; then
  echo "make-secrets: --namespace=$namespace is not a Kubernetes namespace name" >&2; exit 2
fi
if ! [[ "$shards" =~ ^[1-9][0-9]{0,2}$ ]]; then
  echo "make-secrets: --shards wants a number of shards (1-999), not '$shards'" >&2; exit 2
fi
if ! [[ "$days" =~ ^[1-9][0-9]*$ ]]; then
  echo "make-secrets: --days wants a positive number of days, not '$days'" >&2; exit 2
fi
command -v openssl >/dev/null || { echo "make-secrets: needs the openssl tool (Debian package openssl)" >&2; exit 1; }
if [ -e "$out/ca.key" ]; then
  echo "make-secrets: $out already holds a CA (ca.key); remove it or choose another --out" >&2
  exit 1
fi

umask 077
mkdir -p "$out"
work=$(mktemp -d "$out/.work.XXXXXX")
trap 'rm -rf "$work"' EXIT

# The server's names: each shard's short and long forms, and wildcards for
# shards added later (a wildcard covers one label, and OpenSSL matches one
# only where two labels follow it, so the short forms are listed by name).
sans="DNS:*.zenflowd.$namespace.svc,DNS:*.zenflowd.$namespace.svc.$domain"
for ((i = 0; i < shards; i++)); do
  for suffix in "" ".$namespace" ".$namespace.svc" ".$namespace.svc.$domain"; do
    sans="$sans,DNS:zenflowd-$i.zenflowd$suffix"
  done
done
cat >"$work/ext.cnf" <<EOF
[server]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = $sans
[client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
EOF

ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
openssl req -x509 "${ec[@]}" -keyout "$out/ca.key" -out "$out/ca.crt" -days "$((days * 10))" \
  -subj "/CN=zenflow CA ($namespace)" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  2>"$work/log" || { cat "$work/log" >&2; exit 1; }
# leaf NAME CN SECTION: NAME.key and NAME.crt, signed by the CA.
leaf() {
  openssl req -new "${ec[@]}" -keyout "$out/$1.key" -out "$work/$1.csr" -subj "/CN=$2" \
    2>"$work/log" &&
    openssl x509 -req -in "$work/$1.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" \
      -set_serial "0x$(openssl rand -hex 16)" -days "$days" -extfile "$work/ext.cnf" \
      -extensions "$3" -out "$out/$1.crt" 2>"$work/log" || { cat "$work/log" >&2; exit 1; }
}
leaf server "zenflowd.$namespace.svc" server
leaf client "zenflow worker ($namespace)" client
# 32 random bytes, base64url: 43 characters of what zenflowd accepts.
openssl rand -base64 32 | tr '+/' '-_' | tr -d '=\n' >"$out/admin.token"
echo >>"$out/admin.token"

# secret NAME TYPE KEY=FILE...: one Secret manifest.
secret() {
  local name=$1 type=$2 kv
  shift 2
  printf -- '---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: %s\n  namespace: %s\n' "$name" "$namespace"
  printf '  labels:\n    app.kubernetes.io/part-of: zenflow\ntype: %s\ndata:\n' "$type"
  for kv in "$@"; do
    printf '  %s: %s\n' "${kv%%=*}" "$(base64 -w0 <"${kv#*=}")"
  done
}
{
  echo "# Made by deploy/k8s/make-secrets.sh for namespace $namespace ($shards shard(s)); holds keys."
  secret zenflowd-tls kubernetes.io/tls tls.crt="$out/server.crt" tls.key="$out/server.key" ca.crt="$out/ca.crt"
  secret zenflowd-admin-token Opaque admin.token="$out/admin.token"
  secret zenflow-worker-tls kubernetes.io/tls tls.crt="$out/client.crt" tls.key="$out/client.key" ca.crt="$out/ca.crt"
} >"$out/secrets.yaml"
echo "make-secrets: wrote $out/secrets.yaml (Secrets zenflowd-tls, zenflowd-admin-token," \
  "zenflow-worker-tls for namespace $namespace) and the files they hold; the server certificate" \
  "names zenflowd-0..$((shards - 1)).zenflowd[.$namespace[.svc[.$domain]]]"

if [ "$apply" -eq 1 ]; then
  command -v kubectl >/dev/null || { echo "make-secrets: --apply needs kubectl on PATH" >&2; exit 1; }
  kubectl apply -f "$out/secrets.yaml"
fi
