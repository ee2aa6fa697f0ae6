#!/usr/bin/env bash
# The zenflow Python package (python/) under pytest, against a real zenflowd
# on loopback that the tests start: python/tests/test_torch.py.
set -euo pipefail
R="$TEST_SRCDIR/$TEST_WORKSPACE"
export ZENFLOWD="$R/server/zenflowd"
export PYTHONPATH="$R/python:$R/tests"
export ZF_REQUIRE_SIM=1
# tempfile's and pytest's scratch (tmp_path) under the test's own directory.
export TMPDIR="$TEST_TMPDIR"
export ZENFLOW_TOKEN="python-test-token-0123456789"  # the jobs' token (ranks share it)
cd "$R"
exec /usr/bin/python3 -m pytest -q -p no:cacheprovider python/tests
