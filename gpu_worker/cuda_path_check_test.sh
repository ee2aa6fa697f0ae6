#!/usr/bin/env bash
# zf_cuda_path_check against a real zenflowd on loopback. Here (no GPU) the
# host runs must pass and the CUDA part must skip with UNAVAILABLE, counted;
# with a device visible, its CUDA runs must pass too.
set -euo pipefail
R="$TEST_SRCDIR/$TEST_WORKSPACE"
export ZENFLOW_TOKEN="cuda-path-check-token-0123456789"
d="$TEST_TMPDIR"
"$R/server/zenflowd" --listen=127.0.0.1:0 --port_file="$d/port" 2>"$d/zenflowd.log" &
zpid=$!
trap 'kill $zpid 2>/dev/null; wait $zpid 2>/dev/null || true' EXIT
for _ in $(seq 1 200); do [ -s "$d/port" ] && break; sleep 0.05; done
out=$("$R/gpu_worker/zf_cuda_path_check" --target="127.0.0.1:$(cat "$d/port")" --steps=6)
echo "$out"
[ "$(grep -c '^ZF_SUMMARY cuda_path_check mode=' <<<"$out")" -eq 2 ] || { echo "want 2 summaries"; exit 1; }
if grep -q 'cuda=SKIPPED' <<<"$out"; then
  grep -q 'cuda=SKIPPED (UNAVAILABLE: ' <<<"$out" || { echo "the skip must be UNAVAILABLE"; exit 1; }
  [ "$(grep -c 'host=ok cuda=SKIPPED' <<<"$out")" -eq 2 ] || { echo "host runs failed"; exit 1; }
  grep -qx 'cuda_path_check: passed (2 skipped)' <<<"$out"
  # --require_device turns the skip into a failure (gpu_run.sh's mode on a GPU machine).
  if "$R/gpu_worker/zf_cuda_path_check" --target="127.0.0.1:$(cat "$d/port")" --steps=2 \
      --require_device >/dev/null; then
    echo "--require_device passed without a device"; exit 1
  fi
else
  [ "$(grep -c ' PASSED$' <<<"$out")" -eq 2 ] || { echo "CUDA runs differ from the host's"; exit 1; }
fi
echo "cuda_path_check_test: passed"
