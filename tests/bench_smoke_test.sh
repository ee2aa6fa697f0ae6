#!/usr/bin/env bash
# The scale and transport benchmarks run end to end, briefly, against real
# zenflowd processes, and write their figures of merit (docs/scale-benchmark.md,
# "Ingest and round update against their kernels"): every per-run key of
# scale_bench and every per-transport, per-size key of transport_bench is
# there, finite and positive, and the goals carry met flags. No timing is
# part of pass or fail: the figures are only checked to be measured.
#
# Both run the way a lent GPU machine runs them: through the bundle's
# scale.sh (tools/gpu_scale.sh) with the binaries in a bundle's bin/ (here
# links to this test's), so tools/bench_scale.sh without a build
# (ZF_BENCH_BIN), its four daemons placed with taskset (ZF_DAEMON_CPUS /
# ZF_BENCH_CPUS: CPU 0 for both, which every host has).
set -euo pipefail
R="$TEST_SRCDIR/$TEST_WORKSPACE"
dir=$(mktemp -d "$TEST_TMPDIR/bench_smoke.XXXXXX")
fail() { echo "FAIL: $*"; exit 1; }

bundle="$dir/bundle"
mkdir -p "$bundle/bin" "$bundle/lib/ucx"
ln -s "$R/server/zenflowd" "$R/tools/bench/scale_bench" "$R/tools/bench/adam_bench" \
  "$R/tools/bench/transport_bench" "$bundle/bin/"
cp "$R/tools/gpu_scale.sh" "$bundle/scale.sh"
# (UCX_MODULE_DIR: the bundle's copy of the host's UCX modules.)
ln -s /usr/lib/x86_64-linux-gnu/ucx/*.so.0 "$bundle/lib/ucx/"
export ZF_TREE="$R" OUT="$dir/out"

# Half a placement is refused before anything starts.
if ZF_DAEMON_CPUS=0 bash "$bundle/scale.sh" scale >"$dir/half.out" 2>&1; then
  cat "$dir/half.out"; fail "ZF_DAEMON_CPUS without ZF_BENCH_CPUS was accepted"
fi
grep -q "set both ZF_DAEMON_CPUS and ZF_BENCH_CPUS" "$OUT/scale.log" || { cat "$OUT/scale.log"; fail "no message for half a placement"; }

# A bundle without the binaries is refused by name, before anything starts.
mkdir -p "$dir/empty/bin"
cp "$R/tools/gpu_scale.sh" "$dir/empty/scale.sh"
if OUT="$dir/empty_out" bash "$dir/empty/scale.sh" scale >"$dir/empty.out" 2>&1; then
  cat "$dir/empty.out"; fail "a bundle without binaries was accepted"
fi
grep -q "has no executable zenflowd" "$dir/empty_out/scale.log" || { cat "$dir/empty_out/scale.log"; fail "no message for a bundle without binaries"; }
bash "$bundle/scale.sh" nonsense >"$dir/usage.out" 2>&1 && fail "scale.sh nonsense was accepted"
grep -q "usage: scale.sh scale|transport" "$dir/usage.out" || { cat "$dir/usage.out"; fail "no usage line"; }

# 1 and 2 ranks, one job, both sums; a small model (4M parameters: enough
# shard bytes for the daemon's CPU outside updates to span many of /proc's
# 10 ms ticks), few steps; no several-daemons series; a given aggregate
# ceiling, so no adam_bench run.
ZF_DAEMON_CPUS=0 ZF_BENCH_CPUS=0 bash "$bundle/scale.sh" scale \
  --ranks=1,2 --jobs=1 --params=4194304 --steps=24 --ceiling_seconds=0.2 --daemons= \
  --accumulate_ceiling_bytes_per_s=1e10 --accumulate_ceiling_source=smoke \
  >"$dir/scale.out" 2>&1 || { cat "$dir/scale.out"; fail "scale.sh scale"; }

bash "$bundle/scale.sh" transport --transports=grpc,ucx_sm --sizes=64KiB,1MiB \
  --reps=1 --min_seconds=0.1 --min_bytes=8388608 --warmup_bytes=4194304 \
  >"$dir/transport.out" 2>&1 || { cat "$dir/transport.out"; fail "scale.sh transport"; }

python3 - "$OUT/scale.json" "$OUT/transport.json" <<'PY' || fail "the JSON misses a key or a measured value"
import json, math, sys

def nonnegative(where, v):
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
        sys.exit("%s = %r: not a finite number >= 0" % (where, v))

def positive(where, v):
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
        sys.exit("%s = %r: not a finite positive number" % (where, v))

scale = json.load(open(sys.argv[1]))
if not scale["placement"].startswith("daemons on CPUs 0; the bench (emulated ranks, ceilings) on CPUs 0"):
    sys.exit("scale placement = %r" % scale["placement"])
positive("host_cpus", scale["host_cpus"])
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
    # The whole host's busy share of the window: measured, and a share (the
    # 10 ms ticks of /proc/stat at both edges of a short window leave room).
    positive(label + ".host_busy_fraction", r["host_busy_fraction"])
    if r["host_busy_fraction"] > 1.25:
        sys.exit("%s.host_busy_fraction = %r: more than the host's CPUs" % (label, r["host_busy_fraction"]))
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
            "round_update_cpu_fraction", "host_busy_fraction", "goals"):
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
