#!/usr/bin/env bash
# The main job (./zf demo): fine-tune a small byte-level transformer through a
# real zenflowd with 2 ranks in zenflow mode, then the same steps with
# zero_offload (2 ranks) and local AdamW (1 rank, the same tokens per step),
# and print them side by side. Writes per-step logs and an SVG plot of loss
# and stall per step. Expects built binaries (./zf demo builds them).
set -euo pipefail
# The job token every zf_train rank and zf_stats call of this run carries
# (zenflowd requires one; docs/security.md).
export ZENFLOW_TOKEN="${ZENFLOW_TOKEN:-$(head -c 24 /dev/urandom | base64 | tr '+/' '-_')}"
cd "$(dirname "$0")/.."
ROOT=$(pwd)

usage() {
  cat <<'EOF'
usage: ./zf demo [options]
  (names with underscores, as zf_train's flags; dashes in them work too)
  --steps=N              fine-tuning steps per mode (default 160)
  --width=N --layers=N --heads=N --context=N   model size (default 64, 2, 4, 64)
  --batch=N              sequences per rank per step (default 8)
  --lr=X                 learning rate (default 3e-3)
  --topk=X               zenflow: fraction of columns on the worker (default 0.1)
  --interval=N|auto      zenflow: update_interval S (default auto); auto: each round's S
                         chosen from zenflowd's measured round time, 1..4 (docs/design.md rule 10)
  --delay=D              zenflow: sync, 1..S or adaptive (default adaptive)
  --wire=fp32|bf16|fp16|int8
                         gradient wire dtype of both offloaded modes; int8: one byte per
                         value and an fp32 scale per column. Default: the daemon's choice,
                         int8 shards for zenflow and bf16 for zero_offload (docs/design.md rule 5)
  --param_dtype=fp32|bf16|fp16
                         the model's parameter dtype in all three modes (default fp32);
                         bf16/fp16: AdamW on an fp32 master (the important columns' on
                         the worker, the rest on zenflowd, sent back in that dtype)
  --transport=ucx|grpc   data stream of both offloaded modes: UCX shared memory
                         (default) or the gRPC stream; control calls use gRPC
  --emulate_device_ms=N  add N ms of emulated device time per step (default 0)
  --data=PATH            fine-tuning text (default /usr/share/common-licenses/Apache-2.0)
  --pretrain_data=PATH   pretraining text (default /usr/share/common-licenses/GPL-3)
  --daemons=N            start N zenflowd processes and spread each offloaded job over
                         them (default 1; docs/several-daemons.md)
  --target=HOST:PORT[,HOST:PORT...]
                         use running daemons instead of starting them (several: the
                         jobs are spread over them)
  --kill_daemon_at=STEP  kill zenflowd (SIGKILL) once the zenflow run passed STEP and
                         start it again on the same port and --state_dir: the ranks
                         (--daemon_wait=60s) reconnect, replay and finish the run;
                         with --daemons, the first daemon is the one killed
  --out=DIR              where logs and the plot go (default demo-out/)
EOF
}

steps=160 width=64 layers=2 heads=4 context=64 batch=8 lr=3e-3 topk=0.1 interval=auto
delay=adaptive wire= emulate=0 target="" out="$ROOT/demo-out" transport=ucx param_dtype=fp32
data=/usr/share/common-licenses/Apache-2.0 pretrain_data=/usr/share/common-licenses/GPL-3
kill_at="" daemons=1
for a in "$@"; do
  given=$a
  # Flags are spelt with underscores, as zf_train's are; the dashed
  # spellings of the names (--kill-daemon-at) mean the same.
  if [[ "$a" == --* ]]; then
    name="${a%%=*}"
    value="${a:${#name}}"  # "=VALUE" or empty; kept as given (paths have dashes)
    name="${name#--}"
    a="--${name//-/_}$value"
  fi
  case "$a" in
    --help|-h) usage; exit 0 ;;
    --steps=*) steps="${a#*=}" ;;
    --width=*) width="${a#*=}" ;;
    --layers=*) layers="${a#*=}" ;;
    --heads=*) heads="${a#*=}" ;;
    --context=*) context="${a#*=}" ;;
    --batch=*) batch="${a#*=}" ;;
    --lr=*) lr="${a#*=}" ;;
    --topk=*) topk="${a#*=}" ;;
    --interval=*) interval="${a#*=}" ;;
    --delay=*) delay="${a#*=}" ;;
    --wire=*) wire="${a#*=}" ;;
    --param_dtype=*) param_dtype="${a#*=}" ;;
    --transport=*) transport="${a#*=}" ;;
    --emulate_device_ms=*) emulate="${a#*=}" ;;
    --data=*) data="${a#*=}" ;;
    --pretrain_data=*) pretrain_data="${a#*=}" ;;
    --target=*) target="${a#*=}" ;;
    --daemons=*) daemons="${a#*=}" ;;
    --out=*) out="${a#*=}" ;;
    --kill_daemon_at=*) kill_at="${a#*=}" ;;
    *) echo "unknown option $given" >&2; usage >&2; exit 2 ;;
  esac
done
case "$transport" in ucx|grpc) ;; *) echo "--transport must be ucx or grpc" >&2; exit 2 ;; esac
case "$param_dtype" in fp32|bf16|fp16) ;; *) echo "--param_dtype must be fp32, bf16 or fp16" >&2; exit 2 ;; esac
if [ "$interval" != auto ] && { ! [[ "$interval" =~ ^[0-9]+$ ]] || [ "$interval" -lt 1 ]; }; then
  echo "--interval must be auto or a number of steps >= 1" >&2; exit 2
fi
if ! [[ "$daemons" =~ ^[0-9]+$ ]] || [ "$daemons" -lt 1 ] || [ "$daemons" -gt 8 ]; then
  echo "--daemons must be a number in [1, 8]" >&2; exit 2
fi
if [ "$daemons" -gt 1 ] && [ -n "$target" ]; then
  echo "--daemons starts the demo's own daemons: drop --target (or list yours in it)" >&2; exit 2
fi
if [ -n "$kill_at" ]; then
  if ! [[ "$kill_at" =~ ^[0-9]+$ ]] || [ "$kill_at" -lt 1 ] || [ "$kill_at" -ge "$steps" ]; then
    echo "--kill_daemon_at must be a step in [1, --steps) (--steps is $steps)" >&2; exit 2
  fi
  [ -z "$target" ] || { echo "--kill_daemon_at restarts the demo's own zenflowd: drop --target" >&2; exit 2; }
fi
# ./zf demo checks the arguments this way before it builds anything
# ("print": and shows what they set, for tools:demo_args_test).
if [ "${ZF_DEMO_CHECK_ARGS:-}" = "print" ]; then
  printf '%s\n' "steps=$steps" "emulate=$emulate" "pretrain_data=$pretrain_data" \
    "kill_at=$kill_at" "param_dtype=$param_dtype" "wire=$wire"
fi
[ -n "${ZF_DEMO_CHECK_ARGS:-}" ] && exit 0
mkdir -p "$out"
TRAIN="$ROOT/bazel-bin/gpu_worker/zf_train"
ZENFLOWD="$ROOT/bazel-bin/server/zenflowd"
STATS="$ROOT/bazel-bin/tools/zf_stats"
model=(--width="$width" --layers="$layers" --heads="$heads" --context="$context")

# The demo's own zenflowd; its pid lives in a file (--kill_daemon_at starts
# another from a background job).
pidfile="$out/zenflowd.pid"
killer=""
more_pids=()  # --daemons: the second and later daemons
cleanup() {
  [ -n "$killer" ] && kill "$killer" 2>/dev/null
  local q
  for q in "${more_pids[@]}"; do
    kill -TERM "$q" 2>/dev/null && wait "$q" 2>/dev/null
  done
  if [ -s "$pidfile" ]; then
    local p
    p=$(cat "$pidfile")
    if kill -TERM "$p" 2>/dev/null; then
      for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -f "$pidfile"
  fi
  return 0
}
trap cleanup EXIT
# start_daemon [PORT]: starts zenflowd on PORT (0: any) and waits for it.
start_daemon() {
  local extra=()
  if [ -n "$kill_at" ]; then
    mkdir -p "$out/state"
    extra=(--state_dir="$out/state" --checkpoint_every_rounds=5)
  fi
  rm -f "$out/port"  # a previous run's port is not this daemon's
  "$ZENFLOWD" --listen="127.0.0.1:${1:-0}" --port_file="$out/port" "${extra[@]}" 2>>"$out/zenflowd.log" &
  echo $! > "$pidfile"
  disown $!  # killed on purpose by --kill_daemon_at: no "Killed" notice
  for _ in $(seq 1 300); do [ -s "$out/port" ] && break; sleep 0.1; done
  [ -s "$out/port" ] || { cat "$out/zenflowd.log" >&2; echo "zenflowd did not start" >&2; exit 1; }
}
if [ -z "$target" ]; then
  rm -rf "$out/state"
  : > "$out/zenflowd.log"
  start_daemon 0
  target="127.0.0.1:$(cat "$out/port")"
  echo "zenflowd (pid $(cat "$pidfile")) serving on $target"
  for i in $(seq 2 "$daemons"); do
    rm -f "$out/port$i"
    "$ZENFLOWD" --listen=127.0.0.1:0 --port_file="$out/port$i" 2>"$out/zenflowd$i.log" &
    more_pids+=($!)
    for _ in $(seq 1 300); do [ -s "$out/port$i" ] && break; sleep 0.1; done
    [ -s "$out/port$i" ] || { cat "$out/zenflowd$i.log" >&2; echo "zenflowd $i did not start" >&2; exit 1; }
    target="$target,127.0.0.1:$(cat "$out/port$i")"
    echo "zenflowd $i (pid ${more_pids[-1]}) serving on 127.0.0.1:$(cat "$out/port$i")"
  done
  [ "$daemons" -gt 1 ] && echo "each offloaded job is spread over the $daemons daemons: --target=$target"
fi
first="${target%%,*}"  # the daemon --kill_daemon_at kills

# kill_daemon_when JOB: once JOB's rounds cover --kill_daemon_at steps,
# SIGKILLs zenflowd and starts another on the same port and state directory.
kill_daemon_when() {
  # (With --interval=auto rounds have 1..4 steps: count them as 4, which
  # kills at or before the step asked for.)
  local iv=$interval
  [ "$iv" = auto ] && iv=4
  local job=$1 r=0 want=$(( (kill_at + iv - 1) / iv ))
  while [ "$r" -lt "$want" ]; do
    sleep 0.05
    r=$("$STATS" --target="$first" --job="$job" --json --timeout_s=2 2>/dev/null |
        "$ROOT/tools/json_get" - jobs.0.rounds_updated 2>/dev/null) || r=0
  done
  kill -KILL "$(cat "$pidfile")"
  echo "== zenflowd KILLED (SIGKILL) after round $r; starting it again on $first"
  start_daemon "${first##*:}"
  echo "== zenflowd (pid $(cat "$pidfile")) is back: it restored the job from its newest checkpoint"
}

# Pretrained parameters: made once by local pretraining, then cached.
cache="${XDG_CACHE_HOME:-$HOME/.cache}/zenflow"
mkdir -p "$cache"
key=$(printf '%s' "w$width-l$layers-h$heads-c$context-$(basename "$pretrain_data")" | cksum | cut -d' ' -f1)
pre="$cache/pretrained-$key.params"
if [ ! -s "$pre" ]; then
  echo "pretraining the model once on $(basename "$pretrain_data") (local AdamW, 300 steps); cached at $pre"
  "$TRAIN" --mode=local --steps=300 --data="$pretrain_data" --save="$pre.tmp" "${model[@]}" \
    --batch="$batch" --lr="$lr" --progress=false >/dev/null
  mv "$pre.tmp" "$pre"
fi

ft=(--steps="$steps" --init="$pre" --data="$data" --lr="$lr" --threads=1 "${model[@]}"
    --emulate_device_ms="$emulate" --param_dtype="$param_dtype" --progress=false)
run=$(date +%s)
# summary MODE PATH...: fields of the ZF_SUMMARY line in MODE's output, one per line.
summary() { local m=$1; shift; "$ROOT/tools/json_get" --line=ZF_SUMMARY "$out/$m.out" "$@"; }

two_ranks() {  # mode job extra...
  local mode=$1 job=$2; shift 2
  echo "== $mode: 2 ranks (processes) through zenflowd, data over $transport"
  "$TRAIN" --mode="$mode" --job="$job" --world=2 --rank=1 --target="$target" --batch="$batch" \
    --transport="$transport" \
    --log="$out/$mode-rank1.csv" "${ft[@]}" "$@" > "$out/$mode-rank1.out" 2>&1 &
  local r1=$!
  "$TRAIN" --mode="$mode" --job="$job" --world=2 --rank=0 --target="$target" --batch="$batch" \
    --transport="$transport" --log="$out/$mode.csv" --progress=true "${ft[@]}" "$@" | tee "$out/$mode.out" | grep -v '^ZF_SUMMARY' || true
  wait "$r1" || { cat "$out/$mode-rank1.out" >&2; return 1; }
}

zf_extra=()
if [ -n "$kill_at" ]; then
  kill_daemon_when "demo-zf-$run" &
  killer=$!
  zf_extra=(--daemon_wait=60s)
fi
wire_flag=()
[ -n "$wire" ] && wire_flag=(--wire="$wire")
two_ranks zenflow "demo-zf-$run" --topk="$topk" --interval="$interval" --delay="$delay" "${wire_flag[@]}" \
  "${zf_extra[@]}"
if [ -n "$killer" ]; then
  wait "$killer" 2>/dev/null || true
  killer=""
fi
two_ranks zero_offload "demo-zo-$run" "${wire_flag[@]}"
echo "== local: 1 rank, in-process AdamW, batch $((2 * batch)) (the same tokens per step)"
"$TRAIN" --mode=local --batch=$((2 * batch)) --log="$out/local.csv" "${ft[@]}" | tee "$out/local.out" | grep -v '^ZF_SUMMARY' || true

# Each value is read into a variable first: a missing summary or field stops
# the script here (set -e) instead of printing a row of zeros.
zo_step=$(summary zero_offload mean_step_ms)
zf_val=$(summary zenflow val_loss)
lo_val=$(summary local val_loss)
echo
printf '%-14s %10s %14s %16s %16s %12s\n' mode val_loss mean_step_ms stall_ms/step wire_KiB/step speedup
for m in zenflow zero_offload local; do
  fields=$(summary "$m" val_loss mean_step_ms stall_ms_per_step wire_bytes_per_step)
  mapfile -t f <<<"$fields"
  awk -v m="$m" -v v="${f[0]}" -v st="${f[1]}" -v sl="${f[2]}" -v w="${f[3]}" -v z="$zo_step" \
      'BEGIN { printf "%-14s %10.4f %14.2f %16.2f %16.1f %11.2fx\n", m, v, st, sl, w / 1024, z / st }'
done
zo_val=$(summary zero_offload val_loss)
awk -v a="$zf_val" -v b="$lo_val" 'BEGIN { printf "\nzenflow / local validation loss: %.4f\n", a / b }'
# Like for like: zero_offload is AdamW on the mean gradient of the same 2
# ranks and the same data (local runs one rank on other windows).
awk -v a="$zf_val" -v b="$zo_val" \
  'BEGIN { printf "zenflow / zero_offload validation loss (2 ranks, the same data: like for like): %.4f\n", a / b }'
zf_s=$(summary zenflow s_mean)
awk -v i="$interval" -v s="$zf_s" 'BEGIN { printf "zenflow update interval: %s (mean S over its rounds: %.2f)\n", i, s }'
if [ "$param_dtype" != fp32 ]; then
  echo "parameters: $param_dtype in every mode, AdamW on fp32 masters (zenflowd's come back as $param_dtype)"
fi
if [ -n "$kill_at" ] && [ "$(summary zenflow reconnects)" = 0 ]; then
  echo "zenflowd was killed after the zenflow ranks were done with it: nothing to ride through" \
    "(try a smaller --kill_daemon_at)"
elif [ -n "$kill_at" ]; then
  echo "zenflow rode through a zenflowd SIGKILL: each rank reconnected $(summary zenflow reconnects) time(s)" \
    "and dropped $(summary zenflow rounds_dropped_duplicate) round(s) the restarted daemon sent again" \
    "(its mean step includes the wait for the restart)"
fi
if [ "$emulate" != "0" ]; then
  echo "NOTE: every step includes $emulate ms of EMULATED device time (sleep); no GPU ran."
else
  echo "NOTE: everything ran on this machine's CPU (model and daemon share its cores)."
fi

# Plot: loss (top) and stall (bottom) per step, per mode, as SVG.
awk -F, -v out="$out/demo.svg" '
  FNR == 1 { f++; name[f] = FILENAME; sub(/.*\//, "", name[f]); sub(/\.csv$/, "", name[f]); next }
  { n[f]++; loss[f, n[f]] = $2; stall[f, n[f]] = $4
    if ($2 > maxl) maxl = $2; if (minl == "" || $2 < minl) minl = $2; if ($4 > maxs) maxs = $4
    if (n[f] > maxn) maxn = n[f] }
  END {
    W = 900; H = 300; L = 70; color[1] = "#1f77b4"; color[2] = "#d62728"; color[3] = "#2ca02c"
    if (maxs <= 0) maxs = 1
    print "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" W + 160 "\" height=\"" 2 * H + 120 "\" font-family=\"sans-serif\" font-size=\"12\">" > out
    print "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>" > out
    for (p = 0; p < 2; p++) {
      y0 = 40 + p * (H + 40)
      print "<text x=\"" L "\" y=\"" y0 - 10 "\" font-size=\"14\">" (p == 0 ? "training loss per step" : "exposed stall per step (ms)") "</text>" > out
      print "<rect x=\"" L "\" y=\"" y0 "\" width=\"" W "\" height=\"" H "\" fill=\"none\" stroke=\"#888\"/>" > out
      lo = (p == 0 ? minl : 0); hi = (p == 0 ? maxl : maxs)
      printf "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%.3g</text>\n", L - 5, y0 + 10, hi > out
      printf "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%.3g</text>\n", L - 5, y0 + H, lo > out
      for (i = 1; i <= f; i++) {
        pts = ""
        for (s = 1; s <= n[i]; s++) {
          v = (p == 0 ? loss[i, s] : stall[i, s])
          x = L + (s - 1) * W / (maxn > 1 ? maxn - 1 : 1); y = y0 + H - (v - lo) / (hi - lo + 1e-12) * H
          pts = pts sprintf("%.1f,%.1f ", x, y)
        }
        print "<polyline fill=\"none\" stroke=\"" color[i] "\" stroke-width=\"1.5\" points=\"" pts "\"/>" > out
        if (p == 0) print "<text x=\"" L + W + 10 "\" y=\"" y0 + 20 * i "\" fill=\"" color[i] "\">" name[i] "</text>" > out
      }
    }
    print "<text x=\"" L "\" y=\"" 2 * H + 110 "\">step (1 .. " maxn ")</text></svg>" > out
  }' "$out/zenflow.csv" "$out/zero_offload.csv" "$out/local.csv"
echo "per-step logs: $out/{zenflow,zero_offload,local}.csv; plot: $out/demo.svg"
