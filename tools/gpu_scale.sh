#!/usr/bin/env bash
# Issue 31's two benches on a lent GPU machine (copied into .gpu_bundle/ as
# scale.sh by gpu_bundle.sh): `./zf bench scale` and `./zf bench transport`
# with the bundle's binaries, on a host whose cores the emulated ranks need
# not share with the daemon (this project's CI host has 2). One bench per
# device call, each well inside a call's limit:
#
#   device run: carry [".gpu_bundle"], command "bash .gpu_bundle/scale.sh scale", timeout_s 540
#   device run: carry [".gpu_bundle"], command "bash .gpu_bundle/scale.sh transport", timeout_s 540
#
#   scale.sh scale [ARGS...]       tools/bench_scale.sh (ZF_BENCH_BIN = the
#                                  bundle's bin/), JSON in $OUT/scale.json
#   scale.sh transport [ARGS...]   transport_bench against the bundle's
#                                  zenflowd, JSON in $OUT/transport.json
#
# ARGS go to the bench (e.g. --ranks=1,8,16). ZF_DAEMON_CPUS / ZF_BENCH_CPUS
# (tools/bench_scale.sh) place the scale bench's daemons and ranks; unset,
# the host's scheduler spreads them over every CPU. The bench scripts come
# from the working tree the device call runs in (ZF_TREE, default the
# bundle's parent directory). Logs go to $OUT too.
set -uo pipefail
B=$(cd "$(dirname "$0")" && pwd)
TREE=${ZF_TREE:-$(cd "$B/.." && pwd)}
OUT=${OUT:-/tmp/zf-gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$B/lib:${LD_LIBRARY_PATH:-}"
export UCX_MODULE_DIR="$B/lib/ucx"
what=${1:-}
[ $# -gt 0 ] && shift
echo "=== host: $(nproc) CPUs; $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ *//')"
case $what in
  scale)
    [ -x "$TREE/tools/bench_scale.sh" ] || { echo "scale.sh: no $TREE/tools/bench_scale.sh (set ZF_TREE)"; exit 2; }
    ZF_BENCH_BIN="$B/bin" "$TREE/tools/bench_scale.sh" --out="$OUT/scale.json" "$@" \
      > "$OUT/scale.log" 2>&1
    rc=$?
    tail -40 "$OUT/scale.log"
    ;;
  transport)
    ZENFLOWD="$B/bin/zenflowd" "$B/bin/transport_bench" --out="$OUT/transport.json" "$@" \
      > "$OUT/transport.log" 2>&1
    rc=$?
    tail -40 "$OUT/transport.log"
    ;;
  *)
    echo "usage: scale.sh scale|transport [ARGS...]"
    exit 2
    ;;
esac
echo "--- scale.sh $what: exit $rc (JSON and log in $OUT)"
exit $rc
