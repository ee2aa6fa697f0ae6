#!/usr/bin/env bash
# bench_stall.sh: builds stall_bench and zenflowd, starts zenflowd on a free
# loopback port, runs the stall benchmark against it (zero_offload vs zenflow,
# EMULATED device time; see gpu_worker/stall_bench.cc), stops the daemon and
# exits with the benchmark's status. Arguments go to stall_bench, e.g.
#   tools/bench_stall.sh --out=/tmp/stall.json --steps=16
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

log() { printf '\033[1mbench_stall:\033[0m %s\n' "$*" >&2; }

log "building (bazel build -c opt //gpu_worker:stall_bench //server:zenflowd)"
bazel build -c opt //gpu_worker:stall_bench //server:zenflowd

dir=$(mktemp -d "${TMPDIR:-/tmp}/bench_stall.XXXXXX")
pid=""
stop_daemon() {
  if [ -n "$pid" ]; then
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    pid=""
  fi
}
cleanup() {
  stop_daemon
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$ROOT/bazel-bin/server/zenflowd" --listen=127.0.0.1:0 --port_file="$dir/port" 2>"$dir/log" &
pid=$!
for _ in $(seq 1 300); do
  [ -s "$dir/port" ] && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
if [ ! -s "$dir/port" ]; then
  log "zenflowd did not start; its log:"
  sed 's/^/  | /' "$dir/log" >&2
  exit 1
fi
target="127.0.0.1:$(cat "$dir/port")"
log "zenflowd (pid $pid) serving on $target"

rc=0
start=$(date +%s)
"$ROOT/bazel-bin/gpu_worker/stall_bench" --target="$target" "$@" || rc=$?
log "stall_bench exited with $rc after $(( $(date +%s) - start )) s"

stop_daemon
if [ "$rc" -ne 0 ]; then
  log "zenflowd log:"
  sed 's/^/  | /' "$dir/log" >&2
fi
exit "$rc"
