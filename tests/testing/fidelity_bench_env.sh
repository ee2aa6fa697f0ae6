# shellcheck shell=bash
# Sourced by the fidelity bench's tests: tools/bench_fidelity.sh takes the
# test's zf_train, zenflowd and Python extension (not a -c opt build), and
# its caches and scratch stay in the test's own directory. Sets R (the
# runfiles' workspace).
R="$TEST_SRCDIR/$TEST_WORKSPACE"
export ZF_TRAIN="$R/gpu_worker/zf_train"
export ZENFLOWD="$R/server/zenflowd"
export ZF_PYTHON_EXT="$R/python/_zenflow.so"
export HOME="$TEST_TMPDIR/home" XDG_CACHE_HOME="$TEST_TMPDIR/cache"
export TMPDIR="$TEST_TMPDIR"  # the scripts' scratch (tempfile, mktemp) too
mkdir -p "$HOME" "$XDG_CACHE_HOME"
