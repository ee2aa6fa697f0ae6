#!/usr/bin/env bash
# bench_scale.sh: builds scale_bench, adam_bench and zenflowd; measures the
# host's bf16 accumulate rate with adam_bench (./zf bench adam's settings:
# the ceiling the results are quoted against), starts four zenflowd on free
# loopback ports, runs the scale benchmark against them (1, 2, 4, 8, 16
# EMULATED ranks on one job and over 2 jobs, per-rank vs shared sums, on the
# first, each with its ingest bytes per daemon CPU second and round update
# against the kernels' ceilings that scale_bench measures at its start;
# then one job of 2 ranks spread over 1, 2 and 4 daemons; see
# tools/bench/scale_bench.cc), stops the daemons and exits with the
# benchmark's status. Arguments go to scale_bench, e.g.
#   tools/bench_scale.sh --out=/tmp/scale.json --ranks=1,2 --steps=24
# An --accumulate_ceiling_bytes_per_s argument skips the adam_bench run.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

log() { printf '\033[1mbench_scale:\033[0m %s\n' "$*" >&2; }

log "building (bazel build -c opt //tools/bench:scale_bench //tools/bench:adam_bench //server:zenflowd)"
bazel build -c opt //tools/bench:scale_bench //tools/bench:adam_bench //server:zenflowd
# The opt outputs, wherever the bazel-bin link points after other builds.
BIN=$(bazel info -c opt bazel-bin)

dir=$(mktemp -d "${TMPDIR:-/tmp}/bench_scale.XXXXXX")
pid=""
stop_daemon() {
  local p
  for p in $pid; do
    kill -TERM "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  pid=""
}
cleanup() {
  stop_daemon
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The ceiling, before the daemon starts (an idle host).
ceiling_args=()
case " $* " in
  *" --accumulate_ceiling_bytes_per_s="*) ;;
  *)
    log "ceiling: adam_bench (64M params, 2 threads, as ./zf bench adam)"
    "$BIN/tools/bench/adam_bench" --out="$dir/adam.json" >&2
    ceiling=$("$ROOT/tools/json_get" "$dir/adam.json" accumulate_bytes_per_s)
    ceiling_args=(--accumulate_ceiling_bytes_per_s="$ceiling"
                  --accumulate_ceiling_source="adam_bench accumulate_bytes_per_s (DecodeAdd of bf16 into fp32, 64M params, 2 threads), measured at the start of this run")
    ;;
esac

# Four daemons: the matrix runs on the first; the several-daemons series
# (--daemons=1,2,4) spreads one job over the first 1, 2 and 4.
targets=() pids=()
for i in 1 2 3 4; do
  # --admin_socket= : a bench daemon makes no admin socket (the default path
  # is a system daemon's; zfctl would reach the wrong one).
  "$BIN/server/zenflowd" --listen=127.0.0.1:0 --admin_socket= --port_file="$dir/port$i" 2>"$dir/log$i" &
  pids+=($!)
  pid="${pids[*]}"
  for _ in $(seq 1 300); do
    [ -s "$dir/port$i" ] && break
    kill -0 "${pids[-1]}" 2>/dev/null || break
    sleep 0.1
  done
  if [ ! -s "$dir/port$i" ]; then
    log "zenflowd $i did not start; its log:"
    sed 's/^/  | /' "$dir/log$i" >&2
    exit 1
  fi
  targets+=("127.0.0.1:$(cat "$dir/port$i")")
done
target=$(IFS=,; echo "${targets[*]}")
log "zenflowd x4 (pids ${pids[*]}) serving on $target"

rc=0
start=$(date +%s)
"$BIN/tools/bench/scale_bench" --target="$target" --daemon_pid="$(IFS=,; echo "${pids[*]}")" \
  --daemons=1,2,4 "${ceiling_args[@]}" "$@" || rc=$?
log "scale_bench exited with $rc after $(( $(date +%s) - start )) s"

stop_daemon
if [ "$rc" -ne 0 ]; then
  for i in 1 2 3 4; do
    log "zenflowd $i log:"
    sed 's/^/  | /' "$dir/log$i" >&2
  done
fi
exit "$rc"
