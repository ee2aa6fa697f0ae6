#!/usr/bin/env bash
# The main job (./zf demo): fine-tune a small byte-level transformer through a
# real zenflowd with 2 ranks in zenflow mode, then the same steps with
# zero_offload (2 ranks) and local AdamW (1 rank, the same tokens per step),
# and print them side by side. Writes per-step logs and an SVG plot of loss,
# stall and step time per step (tools/demo_plot.py). With --dashboard, also a
# Prometheus on loopback with the stall consoles, and a screenshot of the
# overview console over the whole run (dashboard.png, headless chromium).
# Expects built binaries (./zf demo builds them).
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
  --dashboard            also start Prometheus on 127.0.0.1 (a free port) with the stall
                         consoles (deploy/prometheus/consoles), scraping zenflowd every
                         second; print the console's URL while the demo runs, and write
                         DIR/dashboard.png at the end: the overview console over the whole
                         run, screenshotted by headless chromium (./zf setup installs it),
                         and DIR/dashboard-job.png, the zenflow job's console
  --out=DIR              where logs and the plot go (default demo-out/)
EOF
}

steps=160 width=64 layers=2 heads=4 context=64 batch=8 lr=3e-3 topk=0.1 interval=auto
delay=adaptive wire= emulate=0 target="" out="$ROOT/demo-out" transport=ucx param_dtype=fp32
data=/usr/share/common-licenses/Apache-2.0 pretrain_data=/usr/share/common-licenses/GPL-3
kill_at="" daemons=1 dashboard=0
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
    --dashboard) dashboard=1 ;;
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
if [ "$dashboard" = 1 ] && [ -n "$target" ]; then
  echo "--dashboard scrapes the demo's own daemons: drop --target" >&2; exit 2
fi
# ./zf demo checks the arguments this way before it builds anything
# ("print": and shows what they set, for tools:demo_args_test).
if [ "${ZF_DEMO_CHECK_ARGS:-}" = "print" ]; then
  printf '%s\n' "steps=$steps" "emulate=$emulate" "pretrain_data=$pretrain_data" \
    "kill_at=$kill_at" "param_dtype=$param_dtype" "wire=$wire" "dashboard=$dashboard"
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
prom_pid=""   # --dashboard's Prometheus
cleanup() {
  [ -n "$killer" ] && kill "$killer" 2>/dev/null
  [ -n "$prom_pid" ] && kill -TERM "$prom_pid" 2>/dev/null && wait "$prom_pid" 2>/dev/null
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
# With --dashboard it serves /metrics too, on the port of its first start
# (a restarted daemon keeps the scrape target).
metrics_port=0
start_daemon() {
  local extra=()
  if [ "$dashboard" = 1 ]; then
    rm -f "$out/mport"
    extra+=(--metrics_listen="127.0.0.1:$metrics_port" --metrics_port_file="$out/mport")
  fi
  if [ -n "$kill_at" ]; then
    mkdir -p "$out/state"
    extra+=(--state_dir="$out/state" --checkpoint_every_rounds=5)
  fi
  rm -f "$out/port"  # a previous run's port is not this daemon's
  "$ZENFLOWD" --listen="127.0.0.1:${1:-0}" --port_file="$out/port" "${extra[@]}" 2>>"$out/zenflowd.log" &
  echo $! > "$pidfile"
  disown $!  # killed on purpose by --kill_daemon_at: no "Killed" notice
  for _ in $(seq 1 300); do [ -s "$out/port" ] && break; sleep 0.1; done
  [ -s "$out/port" ] || { cat "$out/zenflowd.log" >&2; echo "zenflowd did not start" >&2; exit 1; }
  if [ "$dashboard" = 1 ]; then
    for _ in $(seq 1 100); do [ -s "$out/mport" ] && break; sleep 0.1; done
    metrics_port=$(cat "$out/mport")
  fi
}
if [ -z "$target" ]; then
  rm -rf "$out/state"
  : > "$out/zenflowd.log"
  start_daemon 0
  target="127.0.0.1:$(cat "$out/port")"
  echo "zenflowd (pid $(cat "$pidfile")) serving on $target"
  for i in $(seq 2 "$daemons"); do
    rm -f "$out/port$i"
    mflags=()
    [ "$dashboard" = 1 ] && mflags=(--metrics_listen=127.0.0.1:0 --metrics_port_file="$out/mport$i")
    rm -f "$out/mport$i"
    "$ZENFLOWD" --listen=127.0.0.1:0 --port_file="$out/port$i" "${mflags[@]}" 2>"$out/zenflowd$i.log" &
    more_pids+=($!)
    for _ in $(seq 1 300); do [ -s "$out/port$i" ] && break; sleep 0.1; done
    [ -s "$out/port$i" ] || { cat "$out/zenflowd$i.log" >&2; echo "zenflowd $i did not start" >&2; exit 1; }
    target="$target,127.0.0.1:$(cat "$out/port$i")"
    echo "zenflowd $i (pid ${more_pids[-1]}) serving on 127.0.0.1:$(cat "$out/port$i")"
  done
  [ "$daemons" -gt 1 ] && echo "each offloaded job is spread over the $daemons daemons: --target=$target"
fi
first="${target%%,*}"  # the daemon --kill_daemon_at kills

# --dashboard: Prometheus on a free loopback port with the stall consoles,
# scraping every daemon's /metrics every second (deploy/prometheus/
# prometheus.yml's scrape job, faster, so that a short run has points).
prom=""
get() { python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' "$1"; }
# scraped_at: the time of Prometheus's last successful scrape of zenflowd (0: none).
scraped_at() {
  get "http://$prom/api/v1/query?query=max(timestamp(up%7Bjob%3D%22zenflowd%22%7D%20%3D%3D%201))" 2>/dev/null |
    python3 -c 'import json, sys; r = json.load(sys.stdin)["data"]["result"]; print(int(float(r[0]["value"][1])) if r else 0)' ||
    echo 0
}
if [ "$dashboard" = 1 ]; then
  command -v prometheus >/dev/null || { echo "--dashboard needs prometheus (./zf setup installs it)" >&2; exit 1; }
  targets="\"127.0.0.1:$metrics_port\""
  for i in $(seq 2 "$daemons"); do
    for _ in $(seq 1 100); do [ -s "$out/mport$i" ] && break; sleep 0.1; done
    targets="$targets, \"127.0.0.1:$(cat "$out/mport$i")\""
  done
  rm -rf "$out/prometheus"
  mkdir -p "$out/prometheus"
  cat >"$out/prometheus/prometheus.yml" <<YML
# ./zf demo --dashboard: deploy/prometheus/prometheus.yml's scrape of zenflowd, every second.
global: {scrape_interval: 1s, evaluation_interval: 1s}
scrape_configs:
  - job_name: zenflowd
    honor_labels: true
    static_configs: [{targets: [$targets]}]
YML
  prom="127.0.0.1:$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  prometheus --config.file="$out/prometheus/prometheus.yml" --storage.tsdb.path="$out/prometheus/data" \
    --web.listen-address="$prom" --web.console.templates="$ROOT/deploy/prometheus/consoles" \
    --web.console.libraries="$ROOT/deploy/prometheus/console_libraries" >"$out/prometheus/prometheus.log" 2>&1 &
  prom_pid=$!
  for _ in $(seq 1 600); do [ "$(scraped_at)" != 0 ] && break; sleep 0.1; done
  [ "$(scraped_at)" != 0 ] || { tail "$out/prometheus/prometheus.log" >&2; echo "Prometheus did not scrape zenflowd" >&2; exit 1; }
  echo "dashboard: http://$prom/consoles/zenflow.html?window=10s (Prometheus $prom, scraping zenflowd every second)"
fi

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
# The pretrained model's validation loss on the fine-tuning data (a local run
# of zero steps), the plot's point at step 0; cached beside the parameters.
pre_val="$pre.val-$(printf '%s' "$(basename "$data")-$batch" | cksum | cut -d' ' -f1)"
if [ ! -s "$pre_val" ]; then
  "$TRAIN" --mode=local --steps=0 --init="$pre" --data="$data" "${model[@]}" --batch="$((2 * batch))" \
    --threads=1 --param_dtype="$param_dtype" --progress=false 2>/dev/null |
    "$ROOT/tools/json_get" --line=ZF_SUMMARY - val_loss >"$pre_val.tmp" 2>/dev/null && mv "$pre_val.tmp" "$pre_val"
  rm -f "$pre_val.tmp"
fi
start_val=$(cat "$pre_val" 2>/dev/null || true)
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
offloaded_end=$(date +%s)  # the end of the runs zenflowd saw (--dashboard's range)
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

# Plot: smoothed training loss with validation points, exposed stall and
# step time per step, per mode (tools/demo_plot.py).
python3 "$ROOT/tools/demo_plot.py" --out="$out/demo.svg" ${start_val:+--start_val="$start_val"} \
  zenflow="$out/zenflow.csv,$out/zenflow.out" zero_offload="$out/zero_offload.csv,$out/zero_offload.out" \
  local="$out/local.csv,$out/local.out"
echo "per-step logs: $out/{zenflow,zero_offload,local}.csv; plot: $out/demo.svg"
if [ "$dashboard" = 1 ]; then
  # Two more scrapes, so that the graphs hold the runs' last figures; then
  # the consoles over the offloaded runs (local mode does not use zenflowd).
  done_at=$(date +%s)
  for _ in $(seq 1 100); do [ "$(scraped_at)" -ge $((done_at + 2)) ] && break; sleep 0.2; done
  rc=0
  python3 "$ROOT/tools/console_shot.py" --base="http://$prom" --range="$((run - 5)),$((offloaded_end + 10))" \
    --page="/consoles/zenflow.html?window=10s" --out="$out/dashboard.png" \
    --page="/consoles/zenflow-job.html?job=demo-zf-$run&window=10s" --out="$out/dashboard-job.png" \
    --require=zf_stall_per_step,zf_stall_fraction,zf_rank_stall,zf_interval,zf_apply_delay >"$out/dashboard.log" 2>&1 || rc=$?
  grep -v '^CONSOLE_SHOT ' "$out/dashboard.log" | sed 's/^/  /'
  # How many jobs the stall graph drew: both offloaded modes'.
  drawn=$(sed -n 's/^CONSOLE_SHOT //p' "$out/dashboard.log" | python3 -c 'import json, sys
g = {x["id"]: x for x in json.load(sys.stdin)[0]["graphs"]}
print(g["zf_stall_per_step"]["series"])' 2>/dev/null) || drawn=0
  if [ "$rc" -ne 0 ] || [ "$drawn" -lt 2 ]; then
    echo "dashboard: FAILED (console_shot.py exit $rc, stall per step drawn for $drawn job(s), want 2); log: $out/dashboard.log" >&2
    exit 1
  fi
  echo "dashboard: $out/dashboard.png (the overview console over the run: stall per step drawn for $drawn jobs, zenflow and zero_offload);" \
    "$out/dashboard-job.png (the zenflow job's console)"
fi
