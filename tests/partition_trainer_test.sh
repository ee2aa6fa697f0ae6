#!/usr/bin/env bash
# A job over two zenflowd processes with real zf_train ranks
# (docs/several-daemons.md):
#  - one rank over UCX with apply delay 1, and two ranks over gRPC with
#    rank-ordered sums in sync: the job spread over daemons A and B ends with
#    the parameters of the same job on A alone, bit for bit;
#  - ./zf stats over both daemons shows each one's part of the map;
#  - daemon B is SIGKILLed mid-run and started again on its port and
#    --state_dir: it restores its part, the rank rides through
#    (--daemon_wait) and still ends bit-identical;
#  - the same with the model's 2-D tensors split by columns over A and B,
#    uninterrupted and through B's SIGKILL and restart;
#  - daemon B killed for good: the rank fails after --daemon_wait with
#    UNAVAILABLE, and the message names B.
set -euo pipefail
export ZENFLOW_TOKEN="${ZENFLOW_TOKEN:-$(head -c 24 /dev/urandom | base64 | tr '+/' '-_')}"
R="$TEST_SRCDIR/$TEST_WORKSPACE"
ZENFLOWD="$R/server/zenflowd"
TRAIN="$R/gpu_worker/zf_train"
STATS="$R/tools/zf_stats"
JSON="$R/tools/json_get"
dir=$(mktemp -d "${TEST_TMPDIR:-/tmp}/parts.XXXXXX")
declare -A pid port
cleanup() {
  local d
  for d in "${!pid[@]}"; do
    [ -n "${pid[$d]}" ] && kill -TERM "${pid[$d]}" 2>/dev/null && wait "${pid[$d]}" 2>/dev/null
  done
  for p in $(jobs -p); do kill "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

# start NAME: zenflowd NAME on its port (any, the first time) and state dir.
start() {
  local d=$1
  mkdir -p "$dir/state_$d"
  rm -f "$dir/port_$d"
  "$ZENFLOWD" --listen="127.0.0.1:${port[$d]:-0}" --port_file="$dir/port_$d" \
    --state_dir="$dir/state_$d" --checkpoint_every_rounds=3 2>>"$dir/zenflowd_$d.log" &
  pid[$d]=$!
  for _ in $(seq 1 300); do [ -s "$dir/port_$d" ] && break; sleep 0.1; done
  [ -s "$dir/port_$d" ] || { echo "zenflowd $d did not start"; cat "$dir/zenflowd_$d.log"; exit 1; }
  port[$d]=$(cat "$dir/port_$d")
}
start A
start B
A="127.0.0.1:${port[A]}"
B="127.0.0.1:${port[B]}"
common=(--width=32 --layers=2 --heads=2 --context=32 --batch=4 --threads=1 --progress=false
        --steps=160 --interval=4 --select_interval=40 --emulate_device_ms=15
        --data=/usr/share/common-licenses/GPL-3)
summary() { "$JSON" --line=ZF_SUMMARY "$1" "$2"; }
rounds_on() {  # TARGET JOB: the daemon's rounds_updated (0 while unknown)
  local out
  out=$("$STATS" --target="$1" --job="$2" --json --timeout_s=2 2>/dev/null) || { echo 0; return; }
  "$JSON" - jobs.0.rounds_updated <<<"$out" 2>/dev/null || echo 0
}

# One rank, UCX, apply delay 1.
one=("${common[@]}" --delay=1 --transport=ucx)
"$TRAIN" "${one[@]}" --job=ref1 --target="$A" --save="$dir/ref1.params" > "$dir/ref1.out"
# --keep_job: ./zf stats reads the job below, after the run.
"$TRAIN" "${one[@]}" --job=two1 --keep_job --target="$A,$B" --save="$dir/two1.params" > "$dir/two1.out"
cmp "$dir/ref1.params" "$dir/two1.params" || {
  echo "one rank over two daemons differs from the same job on one"; exit 1; }
echo "one rank, UCX, delay 1: two daemons equal one bit for bit"

# The map as ./zf stats shows it, one daemon after the other.
"$STATS" --target="$A,$B" --job=two1 > "$dir/stats.txt"
grep -q "partition (map v1): daemon 0 of 2; here: " "$dir/stats.txt" || { cat "$dir/stats.txt"; exit 1; }
grep -q "partition (map v1): daemon 1 of 2; here: " "$dir/stats.txt" || { cat "$dir/stats.txt"; exit 1; }
[ "$("$STATS" --target="$A,$B" --job=two1 --json | "$JSON" - daemons.1.jobs.0.partition.part)" = 1 ]
# Each daemon updated its part's rounds.
[ "$(rounds_on "$A" two1)" -gt 0 ] && [ "$(rounds_on "$B" two1)" -gt 0 ]

# Two ranks, gRPC, sync, rank-ordered sums.
two=("${common[@]}" --delay=sync --transport=grpc --world=2 --rank_ordered_sums)
for t in "$A" "$A,$B"; do
  j=ref2; [ "$t" = "$A" ] || j=two2
  "$TRAIN" "${two[@]}" --job=$j --target="$t" --rank=1 --save="$dir/$j-1.params" > /dev/null &
  r1=$!
  "$TRAIN" "${two[@]}" --job=$j --target="$t" --rank=0 --save="$dir/$j-0.params" > /dev/null
  wait $r1
done
for r in 0 1; do
  cmp "$dir/ref2-0.params" "$dir/two2-$r.params" || {
    echo "rank $r of two over two daemons differs from the same job on one"; exit 1; }
done
echo "two ranks, gRPC, sync: two daemons equal one bit for bit"

# Daemon B SIGKILLed mid-run and started again: its part comes back from
# its checkpoint and the rank rides through.
"$TRAIN" "${one[@]}" --job=ride --target="$A,$B" --daemon_wait=60s --save="$dir/ride.params" \
  > "$dir/ride.out" 2> "$dir/ride.err" &
rank=$!
for _ in $(seq 1 600); do [ "$(rounds_on "$B" ride)" -ge 12 ] && break; sleep 0.05; done
kill -KILL "${pid[B]}"
wait "${pid[B]}" 2>/dev/null || true
echo "killed zenflowd B (SIGKILL) past round 12"
start B
wait $rank || { echo "the rank failed"; cat "$dir/ride.err"; exit 1; }
[ "$(summary "$dir/ride.out" reconnects)" -ge 1 ] || { echo "the rank did not reconnect"; exit 1; }
cmp "$dir/ref1.params" "$dir/ride.params" || {
  echo "the run through daemon B's restart differs from the uninterrupted run"; exit 1; }
echo "daemon B killed and restarted mid-run: bit-identical"

# The model's 2-D tensors split by columns over both daemons
# (--split_tensor_params): still the one-daemon run's bits, and again through
# daemon B's SIGKILL and restart (a block's daemon restores its block).
"$TRAIN" "${one[@]}" --job=split1 --keep_job --target="$A,$B" --split_tensor_params=1000 \
  --save="$dir/split1.params" > "$dir/split1.out"
cmp "$dir/ref1.params" "$dir/split1.params" || {
  echo "one rank over two daemons with split tensors differs from the same job on one"; exit 1; }
"$STATS" --target="$A,$B" --job=split1 > "$dir/split_stats.txt"
grep -q "\[columns 0\.\." "$dir/split_stats.txt" || {
  echo "./zf stats should show the column blocks:"; cat "$dir/split_stats.txt"; exit 1; }
echo "tensors split by columns over two daemons: equal one bit for bit"
"$TRAIN" "${one[@]}" --job=split-ride --target="$A,$B" --split_tensor_params=1000 \
  --daemon_wait=60s --save="$dir/split-ride.params" > "$dir/split-ride.out" 2> "$dir/split-ride.err" &
rank=$!
for _ in $(seq 1 600); do [ "$(rounds_on "$B" split-ride)" -ge 12 ] && break; sleep 0.05; done
kill -KILL "${pid[B]}"
wait "${pid[B]}" 2>/dev/null || true
start B
wait $rank || { echo "the rank failed (split tensors)"; cat "$dir/split-ride.err"; exit 1; }
[ "$(summary "$dir/split-ride.out" reconnects)" -ge 1 ] || { echo "the rank did not reconnect"; exit 1; }
cmp "$dir/ref1.params" "$dir/split-ride.params" || {
  echo "the split run through daemon B's restart differs from the uninterrupted run"; exit 1; }
echo "split tensors, daemon B killed and restarted mid-run: bit-identical"

# Daemon B gone for good: the rank fails after --daemon_wait, naming B.
set +e
"$TRAIN" "${one[@]}" --job=gone --target="$A,$B" --daemon_wait=2s > "$dir/gone.out" 2> "$dir/gone.err" &
rank=$!
for _ in $(seq 1 600); do [ "$(rounds_on "$B" gone)" -ge 4 ] && break; sleep 0.05; done
kill -KILL "${pid[B]}"
wait "${pid[B]}" 2>/dev/null
pid[B]=""
wait $rank
rc=$?
set -e
[ "$rc" != 0 ] || { echo "the rank should have failed with daemon B gone"; exit 1; }
grep -q "UNAVAILABLE" "$dir/gone.err" && grep -q "zenflowd $B (daemon 1 of 2)" "$dir/gone.err" || {
  echo "the failure should be UNAVAILABLE and name daemon B ($B):"; cat "$dir/gone.err"; exit 1; }
echo "daemon B gone: the rank failed naming it: $(grep -m1 "$B" "$dir/gone.err")"
echo PASS
