#!/usr/bin/env bash
# zf_train end to end against a real zenflowd (small configuration):
#  - zero_offload with an fp32 wire equals local AdamW bit for bit;
#  - zenflow (default settings) fine-tuning from a locally pretrained model
#    ends within 2% of local's validation loss;
#  - two zenflow ranks in two processes end bit-identical;
#  - the data stream over UCX gives the same parameters, bit for bit, as over
#    gRPC (zero_offload, and zenflow with a fixed interval and apply delay);
#  - bf16 parameters (--param_dtype=bf16, fp32 masters): zero_offload with an
#    fp32 wire equals local bit for bit, and zenflow ends within 2% of local;
#  - a run ends its job (docs/protocol.md, "When a job ends"): the last rank's
#    end deletes it (the first of two leaves it to the other), so the name
#    runs again; --keep_job keeps it, and a second run with the name is told
#    what holds it and what to do.
set -euo pipefail
# The job token every zf_train rank and zf_stats call of this run carries
# (zenflowd requires one; docs/security.md).
export ZENFLOW_TOKEN="${ZENFLOW_TOKEN:-$(head -c 24 /dev/urandom | base64 | tr '+/' '-_')}"
R="$TEST_SRCDIR/$TEST_WORKSPACE"
ZENFLOWD="$R/server/zenflowd"
TRAIN="$R/gpu_worker/zf_train"
dir=$(mktemp -d "${TEST_TMPDIR:-/tmp}/trainer.XXXXXX")
"$ZENFLOWD" --listen=127.0.0.1:0 --port_file="$dir/port" 2>"$dir/zenflowd.log" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do [ -s "$dir/port" ] && break; sleep 0.1; done
[ -s "$dir/port" ] || { echo "zenflowd did not start"; cat "$dir/zenflowd.log"; exit 1; }
T="127.0.0.1:$(cat "$dir/port")"
common=(--width=48 --layers=2 --heads=4 --context=48 --batch=8 --threads=1 --progress=false)
pretext=/usr/share/common-licenses/GPL-3
fttext=/usr/share/common-licenses/Apache-2.0

# summary OUTPUT PATH: a field of the ZF_SUMMARY line in zf_train's OUTPUT.
summary() { "$R/tools/json_get" --line=ZF_SUMMARY - "$2" <<<"$1"; }

"$TRAIN" --mode=local --steps=200 --data=$pretext --save="$dir/pre.params" "${common[@]}" >/dev/null
ft=(--steps=100 --init="$dir/pre.params" --data=$fttext "${common[@]}")

local_out=$("$TRAIN" --mode=local --save="$dir/local.params" "${ft[@]}")
echo "$local_out"
zo_out=$("$TRAIN" --mode=zero_offload --wire=fp32 --job=zo --target="$T" --save="$dir/zo.params" "${ft[@]}")
echo "$zo_out"
cmp "$dir/local.params" "$dir/zo.params" || { echo "zero_offload (fp32 wire) differs from local AdamW"; exit 1; }

zf_out=$("$TRAIN" --mode=zenflow --job=zf --target="$T" --log="$dir/zf.csv" "${ft[@]}")
echo "$zf_out"
local_val=$(summary "$local_out" val_loss)
zf_val=$(summary "$zf_out" val_loss)
awk -v a="$local_val" -v b="$zf_val" 'BEGIN {
  r = b / a; printf "zenflow/local validation loss ratio %.4f\n", r;
  if (r > 1.02) { print "zenflow is more than 2% worse than local"; exit 1 } }'
[ "$(wc -l < "$dir/zf.csv")" -eq 101 ] || { echo "the per-step log should have 100 rows"; exit 1; }

"$TRAIN" --mode=zenflow --job=two --world=2 --rank=0 --target="$T" --save="$dir/r0.params" "${ft[@]}" > "$dir/r0.out" &
r0=$!
"$TRAIN" --mode=zenflow --job=two --world=2 --rank=1 --target="$T" --save="$dir/r1.params" "${ft[@]}" > "$dir/r1.out"
wait $r0
cmp "$dir/r0.params" "$dir/r1.params" || { echo "two zenflow ranks ended with different parameters"; exit 1; }
cat "$dir/r0.out" "$dir/r1.out"

zo_ucx=$("$TRAIN" --mode=zero_offload --wire=fp32 --job=zo_ucx --transport=ucx --target="$T" \
  --save="$dir/zo_ucx.params" "${ft[@]}")
echo "$zo_ucx"
cmp "$dir/zo.params" "$dir/zo_ucx.params" || { echo "zero_offload over UCX differs from gRPC"; exit 1; }
for t in grpc ucx; do
  # A fixed interval too (auto, the default, chooses from measured timings):
  # S 1 with delay 1, the predicted step on every step.
  "$TRAIN" --mode=zenflow --interval=1 --delay=1 --job="zf1_$t" --transport=$t --target="$T" \
    --save="$dir/zf1_$t.params" "${ft[@]}" > "$dir/zf1_$t.out"
done
cmp "$dir/zf1_grpc.params" "$dir/zf1_ucx.params" || { echo "zenflow over UCX differs from gRPC"; exit 1; }
transport=$("$R/tools/json_get" --line=ZF_SUMMARY "$dir/zf1_ucx.out" transport)
[ "$transport" = ucx ] || { echo "the UCX run's summary does not say ucx"; cat "$dir/zf1_ucx.out"; exit 1; }
lb_out=$("$TRAIN" --mode=local --param_dtype=bf16 --save="$dir/local_bf16.params" "${ft[@]}")
echo "$lb_out"
[ "$(summary "$lb_out" param_dtype)" = bf16 ] || { echo "the bf16 run's summary does not say bf16"; exit 1; }
"$TRAIN" --mode=zero_offload --param_dtype=bf16 --wire=fp32 --job=zo_bf16 --target="$T" \
  --save="$dir/zo_bf16.params" "${ft[@]}"
cmp "$dir/local_bf16.params" "$dir/zo_bf16.params" ||
  { echo "zero_offload with bf16 parameters differs from local AdamW with bf16 parameters"; exit 1; }
! cmp -s "$dir/local.params" "$dir/local_bf16.params" ||
  { echo "bf16 parameters changed nothing"; exit 1; }
zfb_out=$("$TRAIN" --mode=zenflow --param_dtype=bf16 --job=zf_bf16 --target="$T" "${ft[@]}")
echo "$zfb_out"
awk -v a="$(summary "$lb_out" val_loss)" -v b="$(summary "$zfb_out" val_loss)" 'BEGIN {
  r = b / a; printf "bf16 parameters: zenflow/local validation loss ratio %.4f\n", r;
  if (r > 1.02) { print "zenflow (bf16 parameters) is more than 2% worse than local"; exit 1 } }'

[ "$(summary "$zo_out" job_end)" = deleted ] || { echo "zf_train's end should delete its job"; exit 1; }
ends=$(for r in r0 r1; do "$R/tools/json_get" --line=ZF_SUMMARY "$dir/$r.out" job_end; done | sort | tr '\n' ,)
[ "$ends" = "deleted,left to the other ranks," ] || {
  echo "of two ranks, the first to end should leave the job to the other, which deletes it: $ends"
  exit 1; }
small=(--mode=zero_offload --steps=4 --data=$fttext --target="$T" "${common[@]}")
"$TRAIN" "${small[@]}" --job=zo > /dev/null  # the first zo run's name is free again
kept_out=$("$TRAIN" "${small[@]}" --job=kept --keep_job)
[ "$(summary "$kept_out" job_end)" = kept ] || { echo "--keep_job should keep the job"; exit 1; }
if "$TRAIN" "${small[@]}" --job=kept > /dev/null 2> "$dir/taken.err"; then
  echo "a second run with a kept job's name should be refused"; exit 1
fi
grep -q "ALREADY_EXISTS: job 'kept' already exists on this daemon: held since" "$dir/taken.err" &&
  grep -q "zfctl delete kept" "$dir/taken.err" || { cat "$dir/taken.err"; exit 1; }
echo "a second run with a kept job's name: $(cut -c 1-240 "$dir/taken.err")..."
echo "trainer test passed"
