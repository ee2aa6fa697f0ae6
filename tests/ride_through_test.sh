#!/usr/bin/env bash
# Workers ride through a daemon restart
# (docs/checkpoints.md#riding-through-a-daemon-restart),
# with real processes: zf_train ranks run against zenflowd with a
# --state_dir; zenflowd is killed with SIGKILL mid-run (after a checkpoint
# every 3 rounds) and started again on the same port and state directory.
#  - one rank, sync apply delay and apply delay 1, and apply delay 1 with the
#    data over UCX: training completes and the final parameters equal an
#    uninterrupted run's bit for bit;
#  - two ranks with rank-ordered sums (--rank_ordered_sums), sync apply
#    delay and apply delay 1: the final parameters of both ranks equal the
#    uninterrupted run's bit for bit (without rank-ordered sums the daemon
#    adds the ranks' shards in the order they arrive, so two uninterrupted
#    two-rank runs may differ in the last bits);
#  - a rank process killed and started again stops with FAILED_PRECONDITION
#    (it has no worker state), and the other rank ends with ABORTED after
#    --dead_rank_timeout_s;
#  - SIGKILL while a checkpoint file is being written: the newest whole
#    checkpoint is restored and the run still ends bit-identical;
#  - with --daemon_wait=0s a rank fails at once with UNAVAILABLE;
#  - zf_train's default --daemon_wait (5m) rides through (the checkpoint-write
#    kill below), and each run's end deletes its job.
set -euo pipefail
# The job token every zf_train rank and zf_stats call of this run carries
# (zenflowd requires one; docs/security.md).
export ZENFLOW_TOKEN="${ZENFLOW_TOKEN:-$(head -c 24 /dev/urandom | base64 | tr '+/' '-_')}"
R="$TEST_SRCDIR/$TEST_WORKSPACE"
ZENFLOWD="$R/server/zenflowd"
TRAIN="$R/gpu_worker/zf_train"
STATS="$R/tools/zf_stats"
JSON="$R/tools/json_get"
dir=$(mktemp -d "${TEST_TMPDIR:-/tmp}/ride.XXXXXX")
mkdir -p "$dir/state"
dpid=""
cleanup() {
  [ -n "$dpid" ] && kill -TERM "$dpid" 2>/dev/null && wait "$dpid" 2>/dev/null
  for p in $(jobs -p); do kill "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

port=""
extra_flags=()
start_daemon() {
  local listen="127.0.0.1:${port:-0}"
  rm -f "$dir/port"
  "$ZENFLOWD" --listen="$listen" --port_file="$dir/port" --state_dir="$dir/state" \
    --checkpoint_every_rounds=3 "${extra_flags[@]}" 2>>"$dir/zenflowd.log" &
  dpid=$!
  for _ in $(seq 1 300); do [ -s "$dir/port" ] && break; sleep 0.1; done
  [ -s "$dir/port" ] || { echo "zenflowd did not start"; cat "$dir/zenflowd.log"; exit 1; }
  port=$(cat "$dir/port")
}
start_daemon
T="127.0.0.1:$port"
common=(--width=32 --layers=2 --heads=2 --context=32 --batch=4 --threads=1 --progress=false
        --steps=200 --interval=4 --select_interval=40 --emulate_device_ms=15
        --data=/usr/share/common-licenses/GPL-3)

# rounds_updated JOB: the daemon's figure (0 while the job does not exist).
rounds_updated() {
  local out
  out=$("$STATS" --target="$T" --job="$1" --json --timeout_s=2 2>/dev/null) || { echo 0; return; }
  "$JSON" - jobs.0.rounds_updated <<<"$out" 2>/dev/null || echo 0
}

# kill_mid_run JOB: waits until JOB has 12 rounds updated, then SIGKILLs the
# daemon and starts another on the same port and state directory.
kill_mid_run() {
  for _ in $(seq 1 600); do
    [ "$(rounds_updated "$1")" -ge 12 ] && break
    sleep 0.05
  done
  kill -KILL "$dpid"
  wait "$dpid" 2>/dev/null || true
  echo "killed zenflowd (SIGKILL) with job $1 past round 12"
  start_daemon
}

summary() { "$JSON" --line=ZF_SUMMARY "$1" "$2"; }

# (1:grpc:auto: rounds of changing length, --interval=auto with a fixed
# schedule so that both runs have the same rounds.)
for run in sync:grpc 1:grpc 1:ucx 1:grpc:auto; do
  IFS=: read -r delay tr iv <<<"$run"
  name="${delay}_$tr${iv:+_$iv}"
  rounds=()
  [ "$iv" = auto ] && rounds=(--interval=auto --interval_schedule=1,3,2,4)
  "$TRAIN" "${common[@]}" "${rounds[@]}" --delay=$delay --transport=$tr --job="ref_$name" --target="$T" \
    --save="$dir/ref_$name.params" > "$dir/ref_$name.out"
  "$TRAIN" "${common[@]}" "${rounds[@]}" --delay=$delay --transport=$tr --job="ride_$name" --target="$T" \
    --daemon_wait=60s --save="$dir/ride_$name.params" > "$dir/ride_$name.out" 2> "$dir/ride_$name.err" &
  rank=$!
  kill_mid_run "ride_$name"
  wait $rank || { echo "$name: the rank failed"; cat "$dir/ride_$name.err"; exit 1; }
  cat "$dir/ride_$name.err"
  [ "$(summary "$dir/ride_$name.out" reconnects)" = 1 ] || {
    echo "$name: the rank should have reconnected once"; exit 1; }
  cmp "$dir/ref_$name.params" "$dir/ride_$name.params" || {
    echo "$name: the run through a daemon restart differs from the uninterrupted run"; exit 1; }
  [ "$(summary "$dir/ride_$name.out" job_end)" = deleted ] || {
    echo "$name: the run's end should delete its job (restored after the restart)"; exit 1; }
  echo "apply delay $delay over $tr${iv:+, interval $iv}: bit-identical after SIGKILL and restart"
done

# SIGKILL while a checkpoint is being written: the daemon is killed the moment
# a temporary checkpoint file exists (checkpoints every round); the next one
# restores the newest whole checkpoint and the rank still ends bit-identical.
# The rank runs with zf_train's default --daemon_wait (ride-through by default).
ck=(--width=128 --layers=2 --heads=4 --context=32 --batch=4 --threads=1 --progress=false
    --steps=120 --interval=4 --select_interval=40 --emulate_device_ms=5 --delay=sync
    --data=/usr/share/common-licenses/GPL-3)
kill -TERM "$dpid"
wait "$dpid" 2>/dev/null || true
extra_flags=(--checkpoint_every_rounds=1)
start_daemon
"$TRAIN" "${ck[@]}" --job=ckref --target="$T" --save="$dir/ckref.params" > /dev/null
"$TRAIN" "${ck[@]}" --job=ckw --target="$T" --save="$dir/ckw.params" \
  > "$dir/ckw.out" 2> "$dir/ckw.err" &
rank=$!
for _ in $(seq 1 600); do [ "$(rounds_updated ckw)" -ge 8 ] && break; sleep 0.02; done
tmp=""
for _ in $(seq 1 200000); do
  for f in "$dir"/state/ckw/.ckpt-*.tmp.*; do [ -e "$f" ] && tmp=$f; done
  [ -n "$tmp" ] && break
done
kill -KILL "$dpid"
wait "$dpid" 2>/dev/null || true
[ -n "$tmp" ] || { echo "no checkpoint write was seen in progress"; exit 1; }
echo "killed zenflowd (SIGKILL) while it wrote $(basename "$tmp")"
start_daemon
wait $rank || { echo "checkpoint-write kill: the rank failed"; cat "$dir/ckw.err"; exit 1; }
grep "restored job 'ckw'" "$dir/zenflowd.log" | tail -n 1
written=$(basename "$tmp" | sed -n 's/^\.ckpt-0*\([0-9]*\)\.zfck\.tmp\..*/\1/p')
restored=$(grep "restored job 'ckw'" "$dir/zenflowd.log" | tail -n 1 | sed -n 's/.*ckpt-0*\([0-9]*\)\.zfck$/\1/p')
# The kill lands a moment after the temporary file was seen: usually before
# the rename (the checkpoint before it comes back), sometimes just after.
[ -n "$restored" ] && [ "$restored" -le "$written" ] || {
  echo "the restart should have restored checkpoint $written or an earlier one (got '$restored')"; exit 1; }
cmp "$dir/ckref.params" "$dir/ckw.params" || {
  echo "after a SIGKILL mid-checkpoint the run differs from the uninterrupted run"; exit 1; }
echo "SIGKILL during the write of checkpoint $written: checkpoint $restored restored, bit-identical"
grep -q "reconnecting for up to 5m" "$dir/ckw.err" || {
  echo "zf_train's default --daemon_wait should be 5m"; cat "$dir/ckw.err"; exit 1; }
echo "with the default --daemon_wait: $(grep -m1 'reconnecting for up to' "$dir/ckw.err")"
extra_flags=()
kill -TERM "$dpid"
wait "$dpid" 2>/dev/null || true
start_daemon

for delay in sync 1; do
  two=(--world=2 --delay=$delay --rank_ordered_sums --target="$T")
  "$TRAIN" "${common[@]}" "${two[@]}" --job="ref2_$delay" --rank=0 --save="$dir/ref2_$delay.params" \
    > "$dir/ref2_$delay.out" &
  r0=$!
  "$TRAIN" "${common[@]}" "${two[@]}" --job="ref2_$delay" --rank=1 --save="$dir/ref2_${delay}_1.params" \
    > /dev/null
  wait $r0
  cmp "$dir/ref2_$delay.params" "$dir/ref2_${delay}_1.params" || {
    echo "two ranks, apply delay $delay: the uninterrupted ranks ended different"; exit 1; }
  for rank in 0 1; do
    "$TRAIN" "${common[@]}" "${two[@]}" --job="ride2_$delay" --rank=$rank --daemon_wait=60s \
      --save="$dir/ride2_${delay}_$rank.params" > "$dir/ride2_${delay}_$rank.out" \
      2> "$dir/ride2_${delay}_$rank.err" &
    eval "p$rank=\$!"
  done
  kill_mid_run "ride2_$delay"
  for rank in 0 1; do
    eval "p=\$p$rank"
    wait "$p" || { echo "two ranks, apply delay $delay: rank $rank failed"; cat "$dir/ride2_${delay}_$rank.err"; exit 1; }
    [ "$(summary "$dir/ride2_${delay}_$rank.out" reconnects)" = 1 ] || {
      echo "two ranks, apply delay $delay: rank $rank should have reconnected once"; exit 1; }
    cmp "$dir/ref2_$delay.params" "$dir/ride2_${delay}_$rank.params" || {
      echo "two ranks, apply delay $delay: rank $rank differs from the uninterrupted run"; exit 1; }
  done
  echo "two ranks, apply delay $delay: both bit-identical to the uninterrupted run after SIGKILL and restart"
done

# A rank process killed mid-run and started again: the new process has none
# of the rank's worker state, so it stops at once with FAILED_PRECONDITION
# saying so; after --dead_rank_timeout_s the other rank's wait ends with
# ABORTED naming the absent rank (docs/checkpoints.md#dead-ranks).
kill -TERM "$dpid"
wait "$dpid" 2>/dev/null || true
extra_flags=(--dead_rank_timeout_s=2)
start_daemon
two=(--world=2 --delay=1 --target="$T" --job=rankkill)
"$TRAIN" "${common[@]}" "${two[@]}" --rank=0 > /dev/null 2> "$dir/rankkill_0.err" &
r0=$!
"$TRAIN" "${common[@]}" "${two[@]}" --rank=1 > /dev/null 2>&1 &
r1=$!
for _ in $(seq 1 600); do [ "$(rounds_updated rankkill)" -ge 12 ] && break; sleep 0.05; done
kill -KILL "$r1"
wait "$r1" 2>/dev/null || true
echo "killed rank 1 (SIGKILL) past round 12"
if "$TRAIN" "${common[@]}" "${two[@]}" --rank=1 > /dev/null 2> "$dir/rankkill_1.err"; then
  echo "a restarted rank process cannot continue the job and should say so"; exit 1
fi
grep -q "FAILED_PRECONDITION: rank 1 already joined job 'rankkill' (by an earlier process" \
  "$dir/rankkill_1.err" || { cat "$dir/rankkill_1.err"; exit 1; }
echo "restarted rank 1: $(tail -n 1 "$dir/rankkill_1.err" | cut -c 1-160)..."
if wait "$r0"; then echo "rank 0 should fail once rank 1 has been gone 2 s"; exit 1; fi
grep -q "ABORTED: rank 1 of job 'rankkill' has had no data stream" "$dir/rankkill_0.err" || {
  cat "$dir/rankkill_0.err"; exit 1; }
echo "rank 0: $(tail -n 1 "$dir/rankkill_0.err" | cut -c 1-160)..."
extra_flags=()

# With --daemon_wait=0s the rank does not wait.
"$TRAIN" "${common[@]}" --delay=1 --job=nowait --target="$T" --daemon_wait=0s > /dev/null 2> "$dir/nowait.err" &
rank=$!
kill_mid_run nowait
if wait $rank; then echo "a rank with --daemon_wait=0s should fail when zenflowd goes"; exit 1; fi
grep -q "UNAVAILABLE\|CANCELLED" "$dir/nowait.err" || { cat "$dir/nowait.err"; exit 1; }
echo "with --daemon_wait=0s: $(tail -n 1 "$dir/nowait.err")"
echo PASS
