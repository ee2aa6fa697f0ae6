#!/usr/bin/env bash
# The device checks in one run (copied into .gpu_bundle/ by gpu_bundle.sh):
# the CUDA kernels and model against their CPU references, the worker
# benchmark with CUDA figures, zf_train --device=cuda in each mode against a
# real zenflowd (UCX and gRPC), the framework-neutral CUDA path the Python
# extension takes (zf_cuda_path_check: device memory and a stream of the
# CUDA runtime against host arrays, bit for bit) and, where a python3.11
# with a CUDA torch exists, the same through zenflow.torch
# (python/device_check.py). Logs and JSON go to $OUT.
#
# Without a GPU (how gpu_bundle.sh's run is checked here) every CUDA case
# is skipped and counted: gtest's SKIPPED cases, zf_cuda_path_check's
# cuda=SKIPPED, and each --device=cuda run that answers UNAVAILABLE.
set -uo pipefail
export ZENFLOW_TOKEN="${ZENFLOW_TOKEN:-$(head -c 24 /dev/urandom | base64 | tr '+/' '-_')}"  # zenflowd requires a job token
B=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/zf-gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
export UCX_MODULE_DIR="$B/lib/ucx"
status=0
skipped=()
gpu=0
nvidia-smi -L >/dev/null 2>&1 && gpu=1
step() { echo; echo "=== $*"; }
run() {  # name cmd...
  local name=$1; shift
  step "$name: $*"
  local t0=$(date +%s.%N)
  "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  tail -25 "$OUT/$name.log"
  echo "--- $name: exit $rc after $(echo "$(date +%s.%N) - $t0" | bc 2>/dev/null || echo '?') s"
  [ $rc -eq 0 ] || status=1
  return $rc
}
skip() {  # name why
  step "$1: SKIPPED ($2)"; skipped+=("$1")
}
# A --device=cuda run: without a GPU, an UNAVAILABLE answer is a skip.
# --init=FILE of a run that did not happen (pretrain_cuda) skips it too.
run_cuda() {  # name cmd...
  local name=$1 a
  for a in "$@"; do
    case $a in --init=*) [ -s "${a#--init=}" ] || { skip "$name" "no ${a#--init=}: pretrain_cuda did not run"; return; } ;; esac
  done
  if [ $gpu -eq 1 ]; then run "$@"; return; fi
  step "$name: $*"
  shift
  "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ] && grep -q 'UNAVAILABLE' "$OUT/$name.log"; then
    echo "--- $name: SKIPPED (no GPU: $(grep -m1 -o 'UNAVAILABLE.*' "$OUT/$name.log" | cut -c1-120))"
    skipped+=("$name")
  else
    tail -25 "$OUT/$name.log"; echo "--- $name: exit $rc"; [ $rc -eq 0 ] || status=1
  fi
}
step "machine"
nvidia-smi -L 2>&1 || echo "no nvidia-smi"
nproc
run kernels_test "$B/bin/kernels_test"
run transformer_cuda_test "$B/bin/transformer_cuda_test"
if [ $gpu -eq 1 ]; then
  # With a GPU the CUDA cases must run, not skip.
  if grep -h '^\[  SKIPPED \] .*\(cuda\|Cuda\)' "$OUT/kernels_test.log" "$OUT/transformer_cuda_test.log"; then
    echo "--- CUDA cases skipped although a GPU is present"; status=1
  fi
else
  for t in $(grep -ho '^\[  SKIPPED \] [A-Za-z0-9_/]*\.[A-Za-z0-9_/.]*' "$OUT/kernels_test.log" \
             "$OUT/transformer_cuda_test.log" | awk '{print $4}' | sort -u); do
    skipped+=("gtest:$t")
  done
fi
run worker_bench "$B/bin/worker_bench" --out="$OUT/worker.json" --threads=8

dir=$(mktemp -d)
"$B/bin/zenflowd" --listen=127.0.0.1:0 --port_file="$dir/port" --update_threads=8 2>"$OUT/zenflowd.log" &
zpid=$!
for _ in $(seq 1 100); do [ -s "$dir/port" ] && break; sleep 0.1; done
T="127.0.0.1:$(cat "$dir/port" 2>/dev/null)"
# The CUDA path of the Python extension, without Python (--require_device
# on a GPU machine: a skip there is a failure).
run cuda_path_check "$B/bin/zf_cuda_path_check" --target="$T" \
  $([ $gpu -eq 1 ] && echo --require_device)
if grep -q 'cuda=SKIPPED' "$OUT/cuda_path_check.log"; then skipped+=(cuda_path_check:cuda); fi
# ... and through zenflow.torch, where a Python 3.11 with a CUDA torch exists
# (the bundle's _zenflow is built for CPython 3.11).
py=$(command -v python3.11 || true)
if [ -n "$py" ] && "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' \
    >/dev/null 2>&1; then
  run torch_cuda_check env PYTHONPATH="$B/python" "$py" "$B/python/device_check.py" --target="$T"
else
  skip torch_cuda_check "no python3.11 with a CUDA-enabled torch here"
fi
model=(--width=256 --layers=4 --heads=8 --context=128 --batch=16 --threads=8 --progress=false)
run_cuda pretrain_cuda "$B/bin/zf_train" --device=cuda --mode=local --steps=200 \
  --data="$B/data/GPL-3" --save="$dir/pre.params" "${model[@]}"
ft=(--steps=200 --init="$dir/pre.params" --data="$B/data/Apache-2.0" "${model[@]}")
if [ -s "$dir/pre.params" ]; then
  run local_cpu "$B/bin/zf_train" --device=cpu --mode=local "${ft[@]}" --steps=20
else
  skip local_cpu "it fine-tunes pretrain_cuda's parameters"
fi
run_cuda local_cuda "$B/bin/zf_train" --device=cuda --mode=local "${ft[@]}"
run_cuda zero_offload_cuda_ucx "$B/bin/zf_train" --device=cuda --mode=zero_offload --transport=ucx \
  --job=zo --target="$T" "${ft[@]}"
run_cuda zenflow_cuda_ucx "$B/bin/zf_train" --device=cuda --mode=zenflow --transport=ucx \
  --job=zf --target="$T" --log="$OUT/zenflow_cuda.csv" "${ft[@]}"
run_cuda zenflow_cuda_grpc "$B/bin/zf_train" --device=cuda --mode=zenflow --transport=grpc \
  --job=zfg --target="$T" "${ft[@]}"
# The stall benchmark with the kernels on the GPU and the daemon on this
# machine's cores: the configuration the issue's speedup goal is about.
run_cuda stall_cuda_bf16 "$B/bin/stall_bench" --device=cuda --target="$T" --transport=ucx \
  --out="$OUT/stall_cuda_bf16.json"
run_cuda stall_cuda_int8 "$B/bin/stall_bench" --device=cuda --target="$T" --transport=ucx \
  --zenflow_wire=int8 --out="$OUT/stall_cuda_int8.json"
run stall_cpu_bf16 "$B/bin/stall_bench" --device=cpu --target="$T" --transport=ucx \
  --out="$OUT/stall_cpu_bf16.json"
kill -TERM "$zpid" 2>/dev/null; wait "$zpid" 2>/dev/null
step "summaries"
grep -h '^ZF_SUMMARY' "$OUT"/*.log | tee "$OUT/summaries.txt"
echo; echo "gpu_run: skipped ${#skipped[@]}: ${skipped[*]:-none}" | tee "$OUT/skipped.txt"
echo "gpu_run: $( [ $status -eq 0 ] && echo all that ran passed || echo SOME FAILED ) (GPU: $([ $gpu -eq 1 ] && echo yes || echo no); logs in $OUT)"
exit $status
