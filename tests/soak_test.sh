#!/usr/bin/env bash
# The bounded loopback soak (tools/zf_soak.cc; ./zf soak writes its figures
# to bench-results/soak.json): 2 jobs x 8 ranks x 200 rounds over gRPC, then
# over UCX, against a real zenflowd; every update equal to a reference AdamW
# bit for bit, every round received once by every rank, the daemon's RSS flat
# after warm-up, its threads, fds and shared memory back to the baseline.
set -euo pipefail
R="$TEST_SRCDIR/$TEST_WORKSPACE"
exec "$R/tools/zf_soak" --zenflowd="$R/server/zenflowd" --out="$TEST_TMPDIR/soak.json"
