#!/usr/bin/env bash
# The demo against a real zenflowd: two ranks must end bit-identical and the
# loss must fall.
set -euo pipefail
ZENFLOWD="$TEST_SRCDIR/$TEST_WORKSPACE/server/zenflowd"
DEMO="$TEST_SRCDIR/$TEST_WORKSPACE/tools/zf_demo"
dir=$(mktemp -d "${TEST_TMPDIR:-/tmp}/demo.XXXXXX")
"$ZENFLOWD" --listen=127.0.0.1:0 --port_file="$dir/port" 2>"$dir/log" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do [ -s "$dir/port" ] && break; sleep 0.1; done
[ -s "$dir/port" ] || { echo "zenflowd did not start"; cat "$dir/log"; exit 1; }
out=$("$DEMO" --target="127.0.0.1:$(cat "$dir/port")" --rounds=4 --width=32)
echo "$out"
grep -q "all 2 ranks hold bit-identical parameters" <<<"$out"
initial=$(sed -n 's/^initial loss \([0-9.]*\)$/\1/p' <<<"$out")
final=$(sed -n 's/^final loss \([0-9.]*\);.*/\1/p' <<<"$out")
awk -v a="$initial" -v b="$final" 'BEGIN { if (!(b < a)) { print "loss did not fall: " a " -> " b; exit 1 } }'
kill -TERM $pid
wait $pid
trap - EXIT
echo "demo smoke test passed"
