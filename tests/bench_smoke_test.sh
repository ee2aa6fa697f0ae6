#!/usr/bin/env bash
# The scale and transport benchmarks run end to end, briefly, against real
# zenflowd processes, and write their figures of merit (docs/scale-benchmark.md,
# "Ingest and round update against their kernels"): every per-run key of
# scale_bench and every per-transport, per-size key of transport_bench is
# there, finite and positive, and the goals carry met flags. No timing is
# part of pass or fail: the figures are only checked to be measured.
set -euo pipefail
R="$TEST_SRCDIR/$TEST_WORKSPACE"
ZENFLOWD="$R/server/zenflowd"
dir=$(mktemp -d "$TEST_TMPDIR/bench_smoke.XXXXXX")
dpid=""
cleanup() {
  if [ -n "$dpid" ]; then kill -TERM "$dpid" 2>/dev/null || true; wait "$dpid" 2>/dev/null || true; fi
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; [ -f "$dir/zenflowd.log" ] && { echo "--- zenflowd log"; cat "$dir/zenflowd.log"; }; exit 1; }

"$ZENFLOWD" --listen=127.0.0.1:0 --port_file="$dir/port" 2>"$dir/zenflowd.log" &
dpid=$!
for _ in $(seq 1 300); do [ -s "$dir/port" ] && break; sleep 0.1; done
[ -s "$dir/port" ] || fail "zenflowd did not start"

# 1 and 2 ranks, one job, both sums; a small model (4M parameters: enough
# shard bytes for the daemon's CPU outside updates to span many of /proc's
# 10 ms ticks), few steps.
"$R/tools/bench/scale_bench" --target="127.0.0.1:$(cat "$dir/port")" --daemon_pid="$dpid" \
  --ranks=1,2 --jobs=1 --params=4194304 --steps=24 --ceiling_seconds=0.2 \
  --out="$dir/scale.json" >"$dir/scale.out" 2>&1 || { cat "$dir/scale.out"; fail "scale_bench"; }
cleanup
dpid=""

ZENFLOWD="$ZENFLOWD" "$R/tools/bench/transport_bench" --transports=grpc,ucx_sm --sizes=64KiB,1MiB \
  --reps=1 --min_seconds=0.1 --min_bytes=8388608 --warmup_bytes=4194304 \
  --out="$dir/transport.json" >"$dir/transport.out" 2>&1 ||
  { cat "$dir/transport.out"; fail "transport_bench"; }

python3 - "$dir/scale.json" "$dir/transport.json" <<'PY' || fail "the JSON misses a key or a measured value"
import json, math, sys

def nonnegative(where, v):
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
        sys.exit("%s = %r: not a finite number >= 0" % (where, v))

def positive(where, v):
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
        sys.exit("%s = %r: not a finite positive number" % (where, v))

scale = json.load(open(sys.argv[1]))
for key in ("raw_receive_bytes_per_cpu_s", "accumulate_bytes_per_cpu_s_1thread",
            "ingest_ceiling_bytes_per_cpu_s", "accumulate_bytes_per_cpu_s_1thread_beside_copy",
            "ingest_ceiling_beside_copy_bytes_per_cpu_s"):
    positive(key, scale[key])
positive("round_update_kernels.median_ms", scale["round_update_kernels"]["median_ms"])
positive("round_update_kernels.median_cpu_ms", scale["round_update_kernels"]["median_cpu_ms"])
positive("round_update_kernels.values", scale["round_update_kernels"]["values"])
if scale["round_update_kernels"]["values"] != scale["round_update_kernels"]["values_from_shards"]:
    sys.exit("round_update_kernels: %r values, the shards carried %r" % (
        scale["round_update_kernels"]["values"], scale["round_update_kernels"]["values_from_shards"]))
runs = scale["runs"]
if len(runs) != 4:
    sys.exit("scale: %d runs, not 4 (1 and 2 ranks, both sums)" % len(runs))
for r in runs:
    label = "runs[ranks=%d,%s]" % (r["ranks"], r["sums"])
    for key in ("ingest_bytes_per_cpu_s", "ingest_ceiling_bytes_per_cpu_s", "ingest_fraction",
                "ingest_fraction_beside_copy", "round_update_fraction",
                "daemon_outside_update_cpu_s"):
        positive(label + "." + key, r[key])
    # /proc counts CPU in clock ticks (10 ms): a few small updates may read 0.
    nonnegative(label + ".daemon_update_cpu_s", r["daemon_update_cpu_s"])
    # ... so the update's CPU fraction is null exactly when that read 0.
    if r["daemon_update_cpu_s"] > 0:
        positive(label + ".round_update_cpu_fraction", r["round_update_cpu_fraction"])
    elif r["round_update_cpu_fraction"] is not None:
        sys.exit("%s.round_update_cpu_fraction = %r with no update CPU" % (label, r["round_update_cpu_fraction"]))
goals = scale["goals"]
for key in ("ingest_fraction_min", "round_update_fraction_min"):
    if not isinstance(goals[key]["met"], bool):
        sys.exit("scale goals.%s.met = %r" % (key, goals[key]["met"]))
# No 8- or 16-rank run: nothing to compare, met is null.
if goals["ingest_scaling_min"]["met"] is not None:
    sys.exit("scale goals.ingest_scaling_min.met = %r without 8/16-rank runs"
             % goals["ingest_scaling_min"]["met"])
for key in ("ingest_bytes_per_cpu_s", "ingest_fraction", "round_update_fraction",
            "round_update_cpu_fraction", "goals"):
    if key not in scale["definitions"]:
        sys.exit("scale definitions lack " + key)
if not isinstance(scale["goal_met"], bool):
    sys.exit("scale goal_met = %r" % scale["goal_met"])

transport = json.load(open(sys.argv[2]))
for t in ("grpc", "ucx_sm"):
    for size in ("64KiB", "1MiB"):
        p = transport[t][size]
        for key in ("ours_bytes_per_s", "raw_bytes_per_s", "fraction",
                    "accumulate_bytes_per_s_1thread", "ceiling_bytes_per_s",
                    "fraction_of_ceiling"):
            positive("%s.%s.%s" % (t, size, key), p[key])
        if not p["ceiling_bytes_per_s"] < p["raw_bytes_per_s"]:
            sys.exit("%s.%s: the ceiling is not below raw" % (t, size))
g = transport["goals"]
if not isinstance(g["grpc_fraction_min"]["met"], bool):
    sys.exit("transport goals.grpc_fraction_min.met = %r" % g["grpc_fraction_min"]["met"])
# No 4 or 32 MiB size ran: nothing to compare, met is null.
if g["fraction_of_ceiling_min"]["met"] is not None:
    sys.exit("transport goals.fraction_of_ceiling_min.met = %r" % g["fraction_of_ceiling_min"]["met"])
PY
echo PASS
