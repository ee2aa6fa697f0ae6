#!/usr/bin/env bash
# Prepares .gpu_bundle/ (ignored by git) for a session that is lent a GPU
# machine: optimized CUDA-enabled builds of the device-side programs (the
# CUDA path check zf_cuda_path_check and the zenflow package with its
# CUDA-enabled _zenflow for CPython 3.11 among them), the
# shared libraries they need that a non-Debian image lacks (gRPC, protobuf,
# Abseil, UCX...; not libc, libstdc++ or CUDA's own), the two default texts,
# and run.sh (tools/gpu_run.sh), which runs every device check in one go;
# with scale.sh (tools/gpu_scale.sh), issue 31's scale and transport benches
# on the device machine's cores, one device call each.
# The device machine cannot install packages, so this is what travels:
#
#   tools/gpu_bundle.sh
#   device run: carry [".gpu_bundle"], command "bash .gpu_bundle/run.sh", timeout_s 540
#   device run: carry [".gpu_bundle"], command "bash .gpu_bundle/scale.sh scale", timeout_s 540
#   device run: carry [".gpu_bundle"], command "bash .gpu_bundle/scale.sh transport", timeout_s 540
#
# run.sh also works here (no GPU: the CUDA cases skip and --device=cuda
# reports UNAVAILABLE), which is how this script is checked.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x /usr/local/cuda/bin/nvcc ] || { echo "gpu_bundle: needs /usr/local/cuda/bin/nvcc" >&2; exit 1; }
targets=(//gpu_worker/kernels:kernels_test //gpu_worker/model:transformer_cuda_test
         //tools/bench:worker_bench //gpu_worker:zf_train //tools/bench:stall_bench
         //server:zenflowd //gpu_worker:zf_cuda_path_check
         //tools/bench:scale_bench //tools/bench:adam_bench //tools/bench:transport_bench)
# Tests link their libraries dynamically by default: link everything in.
bazel build -c opt --dynamic_mode=off "${targets[@]}" //python:_zenflow.so
B=.gpu_bundle
rm -rf "$B"
mkdir -p "$B/bin" "$B/lib/ucx" "$B/data" "$B/python"
for t in "${targets[@]}"; do
  p=${t#//}; p=${p/://}
  cp "bazel-bin/$p" "$B/bin/"
done
# zenflow.torch's device check (python/device_check.py), for a python3.11
# with a CUDA torch on the device machine.
cp bazel-bin/python/_zenflow.so python/device_check.py "$B/python/"
cp -r python/zenflow "$B/python/"
find "$B/python" -name __pycache__ -prune -exec rm -rf {} +
# Symbols out (the linked-in code's symbol tables are most of each file;
# stack traces then show addresses): what travels stays under 60 MiB.
chmod u+w "$B"/bin/* "$B/python/_zenflow.so"
strip "$B"/bin/*
strip --strip-unneeded "$B/python/_zenflow.so"
skip='linux-vdso|ld-linux|/libc\.so|/libm\.so|/libdl\.so|/libpthread\.so|/librt\.so|/libgcc_s\.so|/libstdc\+\+\.so|libcuda|libcublas|libcudart|libnvidia'
for f in "$B"/bin/* "$B/python/_zenflow.so" /usr/lib/x86_64-linux-gnu/ucx/*.so*; do
  ldd "$f" | awk '$3 ~ /^\// {print $3}'
done | grep -Ev "$skip" | sort -u | while read -r lib; do cp -L "$lib" "$B/lib/"; done
cp -L /usr/lib/x86_64-linux-gnu/ucx/*.so.0 "$B/lib/ucx/"
cp /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0 "$B/data/"
cp tools/gpu_run.sh "$B/run.sh"
cp tools/gpu_scale.sh "$B/scale.sh"
du -sh "$B"
size=$(du -sm "$B" | cut -f1)
[ "$size" -lt 60 ] || { echo "gpu_bundle: $size MiB is too large to travel (64 MiB with the tree)" >&2; exit 1; }
echo "gpu_bundle: ready; on the device: bash .gpu_bundle/run.sh (results under \$OUT)"
