#!/usr/bin/env bash
# The wheels' test (./zf test runs it after `./zf wheel`):
#
#   wheel_test.sh DIST ZENFLOWD
#
# 1. Debian's CPython 3.11: a fresh venv (--system-site-packages, for
#    Debian's python3-torch) gets DIST's cp311 wheel with
#    `pip install --no-index 'zenflow[torch]'` (offline; the torch extra is
#    met by Debian's torch); the extension resolves every library it links
#    outside the build tree (ldd); then wheel_train.py, copied into a
#    directory of its own and run from there by the venv's python (no
#    PYTHONPATH), trains a few steps against a real zenflowd (ZENFLOWD, on a
#    free 127.0.0.1 port).
# 2. Every other CPython whose wheel is in DIST (pyenv's interpreters): a
#    venv each gets its wheel and imports zenflow and _zenflow. Without
#    other interpreters it says so and skips.
# 3. `pip install --no-index .` from the checkout into a fresh venv imports.
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: wheel_test.sh DIST ZENFLOWD" >&2
  exit 2
fi
dist=$(realpath "$1")
zenflowd=$(realpath "$2")
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
tmp=$(mktemp -d "${TEST_TMPDIR:-${TMPDIR:-/tmp}}/zf-wheel-test.XXXXXX")
# What pip and lintian write to TMPDIR goes with this directory.
export TMPDIR="$tmp"
daemon_pid=""
cleanup() {
  if [ -n "$daemon_pid" ]; then kill -TERM "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "wheel_test: FAIL: $*" >&2; exit 1; }
# pip writes nothing under ~ and asks no index.
export PIP_NO_INDEX=1 PIP_CACHE_DIR="$tmp/pip-cache" PIP_DISABLE_PIP_VERSION_CHECK=1
unset PYTHONPATH

wheel_for() {  # TAG -> the wheel's path, or nothing
  ls "$dist"/zenflow-*-"$1"-"$1"-linux_x86_64.whl 2>/dev/null | tail -n 1 || true
}

whl=$(wheel_for cp311)
[ -n "$whl" ] || fail "no cp311 wheel in $dist (run ./zf wheel)"
echo "wheel_test: $(basename "$whl") into a fresh venv of /usr/bin/python3 (--system-site-packages)"
/usr/bin/python3 -m venv --system-site-packages "$tmp/venv311"
"$tmp/venv311/bin/pip" install --quiet --no-index "zenflow[torch] @ file://$whl" \
  || fail "pip install --no-index of $(basename "$whl") failed"
ext=$("$tmp/venv311/bin/python" -c 'import _zenflow; print(_zenflow.__file__)')
case "$ext" in "$tmp/venv311/"*) ;; *) fail "_zenflow was imported from $ext, not from the venv" ;; esac
ldd "$ext" > "$tmp/ldd.txt"
if grep -q "not found" "$tmp/ldd.txt"; then cat "$tmp/ldd.txt"; fail "the extension links a library ldd cannot find"; fi
if grep -qE "$root|bazel|_solib|cuda" "$tmp/ldd.txt" || readelf -d "$ext" | grep -qE 'R(UN)?PATH'; then
  cat "$tmp/ldd.txt"; readelf -d "$ext" | grep -E 'R(UN)?PATH' || true
  fail "the extension finds a library outside Debian's (the build tree, an RPATH, CUDA)"
fi
echo "wheel_test: ldd: $(grep -c '=>' "$tmp/ldd.txt") libraries, all Debian's (none from the build tree or CUDA, no RPATH)"

"$zenflowd" --listen=127.0.0.1:0 --port_file="$tmp/port" --ucx=false 2> "$tmp/zenflowd.log" &
daemon_pid=$!
for _ in $(seq 1 300); do
  [ -s "$tmp/port" ] && break
  kill -0 "$daemon_pid" 2>/dev/null || { cat "$tmp/zenflowd.log" >&2; fail "zenflowd exited"; }
  sleep 0.1
done
[ -s "$tmp/port" ] || fail "zenflowd wrote no port file"
mkdir -p "$tmp/user/conf"
cp "$here/wheel_train.py" "$tmp/user/train.py"
echo '{"lr": 0.01, "steps": 8}' > "$tmp/user/conf/train.json"
(cd "$tmp/user" && ZENFLOW_TARGET="127.0.0.1:$(cat "$tmp/port")" "$tmp/venv311/bin/python" train.py conf/train.json) \
  || { tail -n 20 "$tmp/zenflowd.log" >&2; fail "training from the installed wheel failed"; }

# The other interpreters' wheels: each one's venv imports it.
checked=0
for py in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/*/bin/python3; do
  [ -x "$py" ] || continue
  tag=$("$py" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
  whl=$(wheel_for "$tag")
  if [ -z "$whl" ]; then
    "$py" -c 'import sys; sys.exit(sys.version_info[:2] >= (3, 8))' \
      || fail "no $tag wheel in $dist for $py (3.8 or newer: ./zf wheel builds one)"
    echo "wheel_test: no $tag wheel for $py (./zf wheel skips interpreters older than 3.8)"
    continue
  fi
  "$py" -m venv "$tmp/venv-$tag"
  "$tmp/venv-$tag/bin/pip" install --quiet --no-index "$whl" || fail "pip install of $(basename "$whl") into $py's venv failed"
  out=$(cd "$tmp" && "$tmp/venv-$tag/bin/python" -c \
    'import sys, zenflow, _zenflow; print("%d.%d" % sys.version_info[:2], _zenflow.__file__)') \
    || fail "$(basename "$whl") does not import in $py"
  echo "wheel_test: $(basename "$whl"): imports in $py ($out)"
  checked=$((checked + 1))
done
# 3. `pip install .` from the checkout: pip's build isolation, the in-tree
#    backend (no build requirements, no index), Bazel.
/usr/bin/python3 -m venv "$tmp/venv-src"
(cd "$root" && "$tmp/venv-src/bin/pip" install --quiet --no-index .) \
  || fail "pip install --no-index . from $root failed"
out=$(cd "$tmp" && "$tmp/venv-src/bin/python" -c 'import zenflow, _zenflow; print(_zenflow.__file__)') \
  || fail "zenflow does not import after pip install ."
echo "wheel_test: pip install --no-index . (the checkout, PEP 517 backend): imports ($out)"

[ "$checked" -gt 0 ] || echo "wheel_test: SKIPPED the other interpreters: none found under ${PYENV_ROOT:-$HOME/.pyenv}/versions"
echo "wheel_test: passed (cp311 trained; $checked other interpreter(s) import-checked)"
