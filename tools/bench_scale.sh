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
#
# From the environment:
#   ZF_BENCH_BIN=DIR   zenflowd, scale_bench and adam_bench already built, in
#                      DIR (no bazel build: a machine that cannot build, such
#                      as a lent GPU machine with tools/gpu_bundle.sh's bin/)
#   ZF_DAEMON_CPUS=SET, ZF_BENCH_CPUS=SET
#                      taskset CPU lists for the daemons and for the bench
#                      (its emulated ranks and its ceilings), e.g. 0,1 and
#                      2-15: the ranks on cores of their own, as GPU workers'
#                      host threads are (docs/scale-ingest.md). Unset:
#                      both run on every CPU. The JSON's `placement` says
#                      which.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

log() { printf '\033[1mbench_scale:\033[0m %s\n' "$*" >&2; }

if [ -n "${ZF_BENCH_BIN:-}" ]; then
  ZENFLOWD=$ZF_BENCH_BIN/zenflowd SCALE_BENCH=$ZF_BENCH_BIN/scale_bench ADAM_BENCH=$ZF_BENCH_BIN/adam_bench
  for b in "$ZENFLOWD" "$SCALE_BENCH" "$ADAM_BENCH"; do
    [ -x "$b" ] || { log "ZF_BENCH_BIN=$ZF_BENCH_BIN has no executable $(basename "$b")"; exit 2; }
  done
  log "binaries from $ZF_BENCH_BIN (no build)"
else
  log "building (bazel build -c opt //tools/bench:scale_bench //tools/bench:adam_bench //server:zenflowd)"
  bazel build -c opt //tools/bench:scale_bench //tools/bench:adam_bench //server:zenflowd
  # The opt outputs, wherever the bazel-bin link points after other builds.
  BIN=$(bazel info -c opt bazel-bin)
  ZENFLOWD=$BIN/server/zenflowd SCALE_BENCH=$BIN/tools/bench/scale_bench ADAM_BENCH=$BIN/tools/bench/adam_bench
fi
# Placement: taskset prefixes (empty: every CPU).
daemon_on=() bench_on=() placement=""
if [ -n "${ZF_DAEMON_CPUS:-}${ZF_BENCH_CPUS:-}" ]; then
  if [ -z "${ZF_DAEMON_CPUS:-}" ] || [ -z "${ZF_BENCH_CPUS:-}" ]; then
    log "set both ZF_DAEMON_CPUS and ZF_BENCH_CPUS, or neither"
    exit 2
  fi
  for set in "$ZF_DAEMON_CPUS" "$ZF_BENCH_CPUS"; do
    taskset -c "$set" true 2>/dev/null || { log "taskset -c $set: not a CPU list this host can run on"; exit 2; }
  done
  daemon_on=(taskset -c "$ZF_DAEMON_CPUS")
  bench_on=(taskset -c "$ZF_BENCH_CPUS")
  placement="daemons on CPUs $ZF_DAEMON_CPUS; the bench (emulated ranks, ceilings) on CPUs $ZF_BENCH_CPUS; host of $(nproc) CPUs"
  log "placement: $placement"
fi

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
    ${bench_on[@]+"${bench_on[@]}"} "$ADAM_BENCH" --out="$dir/adam.json" >&2
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
  ${daemon_on[@]+"${daemon_on[@]}"} "$ZENFLOWD" --listen=127.0.0.1:0 --admin_socket= --port_file="$dir/port$i" 2>"$dir/log$i" &
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
${bench_on[@]+"${bench_on[@]}"} "$SCALE_BENCH" --target="$target" --daemon_pid="$(IFS=,; echo "${pids[*]}")" \
  --daemons=1,2,4 --placement="$placement" ${ceiling_args[@]+"${ceiling_args[@]}"} "$@" || rc=$?
log "scale_bench exited with $rc after $(( $(date +%s) - start )) s"

stop_daemon
if [ "$rc" -ne 0 ]; then
  for i in 1 2 3 4; do
    log "zenflowd $i log:"
    sed 's/^/  | /' "$dir/log$i" >&2
  done
fi
exit "$rc"
