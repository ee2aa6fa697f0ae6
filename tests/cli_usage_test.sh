#!/usr/bin/env bash
# The programs' first-contact surface (issue 30):
#  - `--help` of zenflowd, zf_train and zf_stats exits 0 with the text on
#    stdout naming a known flag (zf_train's shows the --tls_* flags), and
#    `--version` prints the version and exits 0;
#  - zenflowd's start-up lines name the bound port when --listen (and
#    --metrics_listen) ask for port 0;
#  - connection mistakes through a real client binary (zf_stats): a URL as
#    the target fails at once naming HOST:PORT, a refused port prints the
#    progress line first and the cause again in the final error, and the
#    next good connection works;
#  - zenflowd refuses an unknown --simd level, and zf_stats reports the
#    level it was pinned to (--simd=scalar).
set -euo pipefail
R="$TEST_SRCDIR/$TEST_WORKSPACE"
ZENFLOWD="$R/server/zenflowd"
TRAIN="$R/gpu_worker/zf_train"
STATS="$R/tools/zf_stats"
dir=$(mktemp -d "${TEST_TMPDIR:?}/cli.XXXXXX")
fail() { echo "FAIL: $*"; exit 1; }

# help PROGRAM FLAG...: --help exits 0 and its stdout names each FLAG.
help() {
  local prog=$1 name
  name=$(basename "$prog")
  shift
  "$prog" --help >"$dir/help.out" 2>"$dir/help.err" || fail "$name --help exited $?"
  for f in "$@"; do
    grep -qE -- "--$f( |=)" "$dir/help.out" || fail "$name --help does not show --$f: $(cat "$dir/help.out")"
  done
  "$prog" -h >/dev/null || fail "$name -h exited $?"
  "$prog" --version >"$dir/version.out" || fail "$name --version exited $?"
  grep -q "^$name [0-9]" "$dir/version.out" || fail "$name --version printed: $(cat "$dir/version.out")"
  echo "ok: $name --help, -h, --version"
}
help "$ZENFLOWD" listen port_file tls_cert
help "$TRAIN" target mode tls_ca tls_cert tls_key tls_server_name
help "$STATS" target json tls_ca
# An unknown flag still fails.
if "$STATS" --no_such_flag >/dev/null 2>&1; then fail "zf_stats took an unknown flag"; fi

# --simd: an unknown level is refused, naming the flag's values.
if "$ZENFLOWD" --listen=127.0.0.1:0 --simd=avx1024 >/dev/null 2>"$dir/simd.err"; then
  fail "zenflowd took --simd=avx1024"
fi
grep -q "zenflowd: --simd must be auto, avx512, avx2 or scalar (not 'avx1024')" "$dir/simd.err" \
  || fail "--simd=avx1024: $(cat "$dir/simd.err")"
echo "ok: --simd=avx1024 refused"

# zenflowd on port 0: the start-up lines name the bound ports. (Its
# kernels pinned to --simd=scalar: zf_stats below reports the level.)
admin="$dir/admin_token"
head -c 24 /dev/urandom | base64 | tr '+/' '-_' >"$admin"
"$ZENFLOWD" --listen=127.0.0.1:0 --port_file="$dir/port" --ucx=false --simd=scalar \
  --metrics_listen=127.0.0.1:0 --metrics_port_file="$dir/metrics_port" \
  --admin_token_file="$admin" 2>"$dir/zenflowd.log" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do grep -q "zenflowd: security:" "$dir/zenflowd.log" 2>/dev/null && break; sleep 0.1; done
[ -s "$dir/port" ] || { cat "$dir/zenflowd.log"; fail "zenflowd did not start"; }
port=$(cat "$dir/port")
mport=$(cat "$dir/metrics_port")
grep -q "gRPC on 127.0.0.1:$port: " "$dir/zenflowd.log" || fail "no bound port in: $(cat "$dir/zenflowd.log")"
grep -q "/metrics on 127.0.0.1:$mport: " "$dir/zenflowd.log" || fail "no metrics port in: $(cat "$dir/zenflowd.log")"
if grep -q "127.0.0.1:0" "$dir/zenflowd.log"; then fail "port 0 in the start-up lines: $(cat "$dir/zenflowd.log")"; fi
echo "ok: start-up lines name ports $port and $mport"

# A URL as the target: at once, naming the form.
start=$SECONDS
if "$STATS" --target=http://127.0.0.1:$port --token_file="$admin" >/dev/null 2>"$dir/url.err"; then
  fail "zf_stats took a URL"
fi
grep -q "INVALID_ARGUMENT: target 'http://127.0.0.1:$port' is a URL" "$dir/url.err" || fail "$(cat "$dir/url.err")"
grep -q "want HOST:PORT" "$dir/url.err" || fail "$(cat "$dir/url.err")"
[ $((SECONDS - start)) -lt 10 ] || fail "the URL took $((SECONDS - start)) s"

# zenflowd's /metrics port (HTTP/1) instead of its gRPC port.
if "$STATS" --target=127.0.0.1:$mport --token_file="$admin" >/dev/null 2>"$dir/http.err"; then
  fail "zf_stats took an HTTP server"
fi
grep -q "FAILED_PRECONDITION: the server at 127.0.0.1:$mport is not zenflowd: it answers plain HTTP" \
  "$dir/http.err" || fail "$(cat "$dir/http.err")"

# A refused port: the progress line, then the final error with the cause.
closed=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()')
if "$STATS" --target=127.0.0.1:$closed --timeout_s=3 --token_file="$admin" >/dev/null 2>"$dir/refused.err"; then
  fail "zf_stats connected to a closed port"
fi
cat "$dir/refused.err"
head -n 1 "$dir/refused.err" | grep -q "^zenflow client: nothing listens at 127.0.0.1:$closed yet (connection refused); waiting up to 3s" \
  || fail "no progress line first"
grep -q "UNAVAILABLE: cannot connect to zenflowd at 127.0.0.1:$closed within 3s in plaintext: nothing listens at 127.0.0.1:$closed yet (connection refused)" \
  "$dir/refused.err" || fail "the final error does not repeat the cause"

# The next good connection works.
"$STATS" --target=127.0.0.1:$port --token_file="$admin" >"$dir/stats.out" 2>"$dir/stats.err" \
  || fail "zf_stats against zenflowd: $(cat "$dir/stats.err")"
grep -q "^zenflowd .*, simd scalar, " "$dir/stats.out" || fail "$(cat "$dir/stats.out")"
echo "ok: zf_stats connection errors, then a good connection"
