#!/usr/bin/env bash
# bench_fidelity.sh: how close ZenFlow fine-tuning gets to plain local AdamW.
#
#   tools/bench_fidelity.sh [--out=PATH] [--quick] [--steps=N]
#
# Builds zf_train and zenflowd (-c opt), starts zenflowd on a free loopback
# port, pretrains a small byte-level transformer once on GPL-3 (--mode=local,
# cached under ${XDG_CACHE_HOME:-~/.cache}/zenflow/pretrained-<hash>.params),
# then fine-tunes it on Apache-2.0 for N steps (default 96, divisible by every
# S): once with --mode=local (the reference) and once with --mode=zenflow for
# every k x S x delay below, each a fresh daemon job. For each run it records
# the validation loss and ratio = val_loss / local val_loss (< 1 is better
# than local). JSON goes to --out (default bench-results/fidelity.json).
#
#   k      0.05 0.1 0.2 0.5          (--quick: 0.1)
#   S      1 2 4 8                   (--quick: 1 4)
#   delay  sync, 1, S (= --delay=S), adaptive
#
# Choices:
#  - select_interval R is fixed at 24 steps for every S (24 is a multiple of
#    1, 2, 4 and 8), so every run reselects its columns at steps 0, 24, 48 and
#    72: the same number of selections whatever S is. (The daemon default,
#    25*S, would give S=1 four selections and S>=4 only the first one in 96
#    steps, mixing the effect of S with that of reselection.)
#  - For S=1, delay "1" and delay "S" are the same setting; both are run and
#    the "S" row carries "same_as":"1".
#  - Every run uses --seed=1, --threads=1 and a bf16 wire (the default); data
#    order and initialization are therefore identical across runs. sync, 1
#    and S are deterministic; adaptive picks its delay from measured timings
#    (close-to-done vs step time), so it may vary between invocations and
#    machines.
#  - zenflowd runs with --update_threads=1 (the machine has few cores).
set -euo pipefail
# The job token every zf_train rank and zf_stats call of this run carries
# (zenflowd requires one; README "Security").
export ZENFLOW_TOKEN="${ZENFLOW_TOKEN:-$(head -c 24 /dev/urandom | base64 | tr '+/' '-_')}"
cd "$(dirname "$0")/.."
ROOT=$(pwd)

out="$ROOT/bench-results/fidelity.json"
quick=0
steps=96
for a in "$@"; do
  case "$a" in
    --out=*) out="${a#--out=}" ;;
    --quick) quick=1 ;;
    --steps=*) steps="${a#--steps=}" ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "bench_fidelity: unknown argument '$a' (--out=PATH, --quick, --steps=N)" >&2; exit 2 ;;
  esac
done
case "$steps" in ''|*[!0-9]*) echo "bench_fidelity: --steps must be a positive integer" >&2; exit 2 ;; esac
if [ "$steps" -lt 8 ] || [ $((steps % 8)) -ne 0 ]; then
  echo "bench_fidelity: --steps=$steps must be a positive multiple of 8 (every S divides it)" >&2
  exit 2
fi
case "$out" in /*) ;; *) out="$ROOT/$out" ;; esac

log() { printf '\033[1mbench_fidelity:\033[0m %s\n' "$*" >&2; }
start=$SECONDS

# ---- settings ---------------------------------------------------------------
LAYERS=2 WIDTH=48 HEADS=4 CONTEXT=48 BATCH=8 LR=3e-3 WD=0 SEED=1 THREADS=1
PRE_DATA=/usr/share/common-licenses/GPL-3
PRE_STEPS=200
FT_DATA=/usr/share/common-licenses/Apache-2.0
SELECT_INTERVAL=24
WIRE=bf16
if [ "$quick" -eq 1 ]; then
  KS=(0.1); SS=(1 4)
else
  KS=(0.05 0.1 0.2 0.5); SS=(1 2 4 8)
fi
DELAYS=(sync 1 S adaptive)
for f in "$PRE_DATA" "$FT_DATA"; do
  [ -r "$f" ] || { echo "bench_fidelity: $f is missing (Debian's base-files)" >&2; exit 1; }
done

# ---- build ------------------------------------------------------------------
log "building zf_train and zenflowd (-c opt)"
bazel build -c opt //gpu_worker:zf_train //server:zenflowd >&2
bin=$(bazel info -c opt bazel-bin 2>/dev/null)
work=$(mktemp -d "${TMPDIR:-/tmp}/bench_fidelity.XXXXXX")
# Private copies: others may rebuild the tree while this runs.
cp "$bin/gpu_worker/zf_train" "$bin/server/zenflowd" "$work/"
TRAIN="$work/zf_train"
ZENFLOWD="$work/zenflowd"

zpid=""
tmp=""
cleanup() {
  [ -n "$tmp" ] && rm -f "$tmp.params" "$tmp.summary"
  if [ -n "$zpid" ]; then
    kill -TERM "$zpid" 2>/dev/null || true
    wait "$zpid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

common=(--layers=$LAYERS --width=$WIDTH --heads=$HEADS --context=$CONTEXT --batch=$BATCH
        --lr=$LR --weight_decay=$WD --seed=$SEED --threads=$THREADS --progress=false)

# run NAME ARGS...: runs zf_train, prints its ZF_SUMMARY json; shows its log on failure.
run() {
  local name=$1; shift
  local o
  if ! o=$("$TRAIN" "$@" "${common[@]}" 2>"$work/$name.err"); then
    echo "bench_fidelity: zf_train ($name) failed:" >&2
    tail -n 20 "$work/$name.err" >&2
    [ -s "$work/zenflowd.log" ] && { echo "--- zenflowd log:" >&2; tail -n 20 "$work/zenflowd.log" >&2; }
    return 1
  fi
  o=$(sed -n 's/^ZF_SUMMARY //p' <<<"$o" | tail -n 1)
  [ -n "$o" ] || { echo "bench_fidelity: zf_train ($name) printed no ZF_SUMMARY" >&2; return 1; }
  printf '%s\n' "$o"
}
# field JSON PATH...: fields of a JSON document, one per line; a missing one
# stops the script (set -e) when the caller assigns the result.
field() { local json=$1; shift; "$ROOT/tools/json_get" - "$@" <<<"$json"; }

# ---- pretrained model (cached) ---------------------------------------------
cache_dir="${XDG_CACHE_HOME:-$HOME/.cache}/zenflow"
mkdir -p "$cache_dir"
hash=$( {
  echo "layers=$LAYERS width=$WIDTH heads=$HEADS context=$CONTEXT batch=$BATCH lr=$LR wd=$WD seed=$SEED steps=$PRE_STEPS"
  sha256sum < "$PRE_DATA"
  # A change to the CPU model or the data sampler (what the parameters depend
  # on) invalidates the cache; tests, benchmarks and the CUDA files do not.
  cat gpu_worker/model/transformer.h gpu_worker/model/transformer.cc \
      gpu_worker/model/text_data.h gpu_worker/model/text_data.cc 2>/dev/null | sha256sum
} | sha256sum | cut -c1-16)
pre="$cache_dir/pretrained-$hash.params"
pre_summary="$cache_dir/pretrained-$hash.summary"
if [ -s "$pre" ]; then
  pre_reused=true
  log "reusing pretrained parameters $pre"
else
  pre_reused=false
  log "pretraining ($PRE_STEPS steps, --mode=local) on $PRE_DATA"
  # Written next to the cache entry, then renamed: concurrent runs never see half a file.
  tmp="$cache_dir/.pretrained-$hash.$$"
  s=$(run pretrain --mode=local --steps=$PRE_STEPS --data="$PRE_DATA" --save="$tmp.params")
  printf "%s\n" "$s" > "$tmp.summary"
  mv -f "$tmp.summary" "$pre_summary"
  mv -f "$tmp.params" "$pre"
fi
# The pretraining loss is informational: an unreadable cached summary (json_get
# says why on stderr) leaves it null rather than failing the benchmark.
pre_val=null
if [ -s "$pre_summary" ]; then
  pre_val=$("$ROOT/tools/json_get" "$pre_summary" val_loss) || pre_val=null
fi

# ---- zenflowd ---------------------------------------------------------------
"$ZENFLOWD" --listen=127.0.0.1:0 --port_file="$work/port" --update_threads=1 2>"$work/zenflowd.log" &
zpid=$!
for _ in $(seq 1 300); do [ -s "$work/port" ] && break; sleep 0.1; done
[ -s "$work/port" ] || { echo "bench_fidelity: zenflowd did not start" >&2; cat "$work/zenflowd.log" >&2; exit 1; }
T="127.0.0.1:$(cat "$work/port")"
log "zenflowd on $T (pid $zpid)"

ft=(--steps=$steps --init="$pre" --data="$FT_DATA")

# ---- reference --------------------------------------------------------------
log "fine-tuning reference: --mode=local, $steps steps on $FT_DATA"
ref=$(run local --mode=local "${ft[@]}")
local_val=$(field "$ref" val_loss)
params=$(field "$ref" params)
ref_step=$(field "$ref" mean_step_ms)
log "local val_loss $(printf '%.6f' "$local_val")"

# ---- zenflow grid -----------------------------------------------------------
rows="$work/rows.tsv"   # k S delay val ratio same_as step_ms stall_ms wire_bytes train_ema
: > "$rows"
total=$(( ${#KS[@]} * ${#SS[@]} * ${#DELAYS[@]} ))
i=0
for k in "${KS[@]}"; do
  for S in "${SS[@]}"; do
    for delay in "${DELAYS[@]}"; do
      i=$((i + 1))
      d=$delay; [ "$delay" = S ] && d=$S
      same=""; [ "$delay" = S ] && [ "$S" -eq 1 ] && same=1
      job="fid-$$-k$k-S$S-d$delay"
      s=$(run "$job" --mode=zenflow --job="$job" --target="$T" --topk="$k" --interval="$S" \
            --select_interval=$SELECT_INTERVAL --delay="$d" --wire=$WIRE "${ft[@]}")
      fields=$(field "$s" val_loss mean_step_ms stall_ms_per_step wire_bytes_per_step train_loss_ema)
      mapfile -t f <<<"$fields"
      v=${f[0]}
      r=$(awk -v a="$v" -v b="$local_val" 'BEGIN { printf "%.6f", a / b }')
      printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$k" "$S" "$delay" "$v" "$r" "${same:--}" \
        "${f[1]}" "${f[2]}" "${f[3]}" "${f[4]}" >> "$rows"
      printf '  [%2d/%d] k=%-4s S=%s delay=%-8s val_loss %s  ratio %s\n' "$i" "$total" "$k" "$S" "$delay" "$v" "$r" >&2
    done
  done
done
runtime=$((SECONDS - start))

# ---- JSON -------------------------------------------------------------------
mkdir -p "$(dirname "$out")"
awk -F'\t' \
  -v local_val="$local_val" -v steps="$steps" -v params="$params" \
  -v layers=$LAYERS -v width=$WIDTH -v heads=$HEADS -v context=$CONTEXT -v batch=$BATCH \
  -v lr=$LR -v wd=$WD -v seed=$SEED -v threads=$THREADS -v wire=$WIRE \
  -v pre_data="$PRE_DATA" -v pre_steps=$PRE_STEPS -v pre_val="$pre_val" -v pre_path="$pre" \
  -v pre_hash="$hash" -v pre_reused=$pre_reused -v ft_data="$FT_DATA" -v sel=$SELECT_INTERVAL \
  -v quick=$quick -v runtime=$runtime -v ref_step="$ref_step" '
  {
    n++
    k[n] = $1; S[n] = $2; d[n] = $3; v[n] = $4; r[n] = $5; same[n] = $6
    ms[n] = $7; stall[n] = $8; wireb[n] = $9; ema[n] = $10
    sum += $5
    if (n == 1 || $5 > mx) mx = $5
    if (n == 1 || $5 < mn) mn = $5
    if ($1 + 0 == 0.1 && $2 == 4 && $3 == "adaptive") def = $5
  }
  END {
    printf "{\n"
    printf "  \"benchmark\": \"fidelity\",\n"
    printf "  \"quick\": %s,\n", quick ? "true" : "false"
    printf "  \"local_val_loss\": %s,\n", local_val
    printf "  \"steps\": %d,\n", steps
    printf "  \"model\": {\"layers\": %d, \"width\": %d, \"heads\": %d, \"context\": %d, \"batch\": %d, \"params\": %d, \"lr\": %s, \"weight_decay\": %s, \"seed\": %d, \"threads\": %d},\n", layers, width, heads, context, batch, params, lr, wd, seed, threads
    printf "  \"pretrain\": {\"mode\": \"local\", \"data\": \"%s\", \"steps\": %d, \"val_loss\": %s, \"cache\": \"%s\", \"config_hash\": \"%s\", \"reused\": %s},\n", pre_data, pre_steps, pre_val, pre_path, pre_hash, pre_reused
    printf "  \"finetune\": {\"data\": \"%s\", \"steps\": %d, \"select_interval\": %d, \"wire\": \"%s\", \"local_mean_step_ms\": %s, \"zenflowd_update_threads\": 1},\n", ft_data, steps, sel, wire, ref_step
    printf "  \"runs\": [\n"
    for (i = 1; i <= n; i++) {
      printf "    {\"k\": %s, \"S\": %d, \"delay\": \"%s\", \"val_loss\": %s, \"ratio\": %s", k[i], S[i], d[i], v[i], r[i]
      if (same[i] != "-") printf ", \"same_as\": \"%s\"", same[i]
      printf ", \"train_loss_ema\": %s, \"mean_step_ms\": %s, \"stall_ms_per_step\": %s, \"wire_bytes_per_step\": %s}%s\n", ema[i], ms[i], stall[i], wireb[i], i < n ? "," : ""
    }
    printf "  ],\n"
    printf "  \"summary\": {\"runs\": %d, \"max_ratio\": %.6f, \"min_ratio\": %.6f, \"mean_ratio\": %.6f, \"default_ratio\": %s},\n", n, mx, mn, sum / n, def == "" ? "null" : def
    printf "  \"runtime_s\": %d\n", runtime
    printf "}\n"
  }' "$rows" > "$out.tmp"
mv -f "$out.tmp" "$out"

# ---- table ------------------------------------------------------------------
echo
printf 'ZenFlow fine-tuning fidelity: val_loss / local val_loss (%.6f), %s steps, R=%s\n' "$local_val" "$steps" "$SELECT_INTERVAL"
echo "(< 1: better than local; '=' marks S=1 delay S, the same setting as delay 1)"
awk -F'\t' '
  { key = $1 SUBSEP $2; if (!(key in seen)) { seen[key] = 1; order[++n] = key; kk[n] = $1; ss[n] = $2 }
    cell[key, $3] = sprintf("%.4f%s", $5, $6 == "-" ? " " : "=") }
  END {
    printf "%-6s %-3s  %-9s %-9s %-9s %-9s\n", "k", "S", "sync", "1", "S", "adaptive"
    for (i = 1; i <= n; i++)
      printf "%-6s %-3s  %-9s %-9s %-9s %-9s\n", kk[i], ss[i], cell[order[i], "sync"], cell[order[i], "1"],
             cell[order[i], "S"], cell[order[i], "adaptive"]
  }' "$rows"
awk -F'\t' '{ s += $5; if (NR == 1 || $5 > mx) mx = $5; if (NR == 1 || $5 < mn) mn = $5;
  if ($1 + 0 == 0.1 && $2 == 4 && $3 == "adaptive") def = $5 }
  END { printf "max %.4f  min %.4f  mean %.4f  default (k=0.1, S=4, adaptive) %s\n", mx, mn, s / NR, def == "" ? "-" : sprintf("%.4f", def) }' "$rows"
echo "wrote $out in ${runtime}s"
