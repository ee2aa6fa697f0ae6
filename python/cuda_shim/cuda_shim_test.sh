#!/usr/bin/env bash
# The extension's CUDA path under the fake CUDA runtime (fake_cudart.so,
# LD_PRELOADed ahead of libcudart): python/cuda_shim/test_cuda_shim.py,
# against a real zenflowd on loopback that the tests start.
set -euo pipefail
R="$TEST_SRCDIR/$TEST_WORKSPACE"
export ZENFLOWD="$R/server/zenflowd"
export PYTHONPATH="$R/python:$R/python/tests"
export TMPDIR="$TEST_TMPDIR"
export ZENFLOW_TOKEN="cuda-shim-test-token-0123456789"
export ZF_FAKE_CUDA_LOG="$TEST_TMPDIR/fake_cuda.log"
cd "$R"
LD_PRELOAD="$R/python/fake_cudart.so" exec /usr/bin/python3 -m pytest -q -p no:cacheprovider \
  python/cuda_shim
