#!/usr/bin/env bash
# bench_stall.sh: builds stall_bench and zenflowd, starts zenflowd on a free
# loopback port, runs the stall benchmark against it (zero_offload vs zenflow,
# EMULATED device time; see tools/bench/stall_bench.cc), stops the daemon and
# exits with the benchmark's status. Arguments go to stall_bench, e.g.
#   tools/bench_stall.sh --out=/tmp/stall.json --steps=16
# Where the engine's kernels run: with no --device argument, a machine with a
# visible GPU (nvidia-smi -L lists one and /dev/nvidia0 exists) uses
# --device=cuda, any other one --device=emulated --device_profile=h100-sxm
# (an EMULATED GPU: modelled kernel and copy times, the host doing only what
# it would beside a real GPU; see gpu_worker/kernels/emulated_backend.h).
# Override with --device=cpu|cuda|emulated [--device_profile=NAME], or with
# ZF_STALL_DEVICE / ZF_STALL_DEVICE_PROFILE in the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

log() { printf '\033[1mbench_stall:\033[0m %s\n' "$*" >&2; }

log "building (bazel build -c opt //tools/bench:stall_bench //server:zenflowd)"
bazel build -c opt //tools/bench:stall_bench //server:zenflowd

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

"$ROOT/bazel-bin/server/zenflowd" --listen=127.0.0.1:0 --admin_socket= --port_file="$dir/port" 2>"$dir/log" &
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

# The device, unless the arguments name one.
device_args=()
case " $* " in
  *" --device="*) ;;
  *)
    if [ -n "${ZF_STALL_DEVICE:-}" ]; then
      device="$ZF_STALL_DEVICE"
    elif [ -e /dev/nvidia0 ] && nvidia-smi -L >/dev/null 2>&1; then
      device=cuda
    else
      device=emulated
    fi
    device_args=(--device="$device")
    if [ "$device" = emulated ]; then
      case " $* " in
        *" --device_profile="*) ;;
        *) device_args+=(--device_profile="${ZF_STALL_DEVICE_PROFILE:-h100-sxm}") ;;
      esac
    fi
    ;;
esac
log "device: ${device_args[*]:-(from the arguments)}"

rc=0
start=$(date +%s)
"$ROOT/bazel-bin/tools/bench/stall_bench" --target="$target" "${device_args[@]}" "$@" || rc=$?
log "stall_bench exited with $rc after $(( $(date +%s) - start )) s"

stop_daemon
if [ "$rc" -ne 0 ]; then
  log "zenflowd log:"
  sed 's/^/  | /' "$dir/log" >&2
fi
exit "$rc"
