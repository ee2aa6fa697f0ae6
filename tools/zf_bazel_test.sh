#!/usr/bin/env bash
# tools/zf_bazel/bazel, the `bazel` ./zf puts first on PATH: it runs the
# next bazel on PATH (never itself, even when its directory is listed
# twice) with --max_idle_secs before the caller's arguments, 60 by default
# or ZF_BAZEL_IDLE_SECS, and says what to install when there is none;
# another checkout's copy of it on PATH is skipped too.
set -euo pipefail
shim_dir="$TEST_SRCDIR/$TEST_WORKSPACE/tools/zf_bazel"
fake="$TEST_TMPDIR/fake"
mkdir -p "$fake"
cat >"$fake/bazel" <<'SH'
#!/usr/bin/env bash
printf '%s\n' "$@"
SH
chmod +x "$fake/bazel"
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

got=$(PATH="$shim_dir:$shim_dir:$fake:/usr/bin:/bin" bazel --output_base=/x build //a:b)
want=$'--max_idle_secs=60\n--output_base=/x\nbuild\n//a:b'
[ "$got" = "$want" ] || fail "default: got [$got], want [$want]"
got=$(ZF_BAZEL_IDLE_SECS=5 PATH="$shim_dir:$fake:/usr/bin:/bin" bazel info)
[ "$got" = $'--max_idle_secs=5\ninfo' ] || fail "ZF_BAZEL_IDLE_SECS=5: got [$got]"
# Another checkout's copy of the wrapper on PATH is skipped, not run (the
# two would call each other without end).
other="$TEST_TMPDIR/other_checkout"
mkdir -p "$other"
cp "$shim_dir/bazel" "$other/bazel"
chmod +x "$other/bazel"
got=$(PATH="$shim_dir:$other:$fake:/usr/bin:/bin" timeout 20 bazel info) ||
  fail "with another checkout's wrapper on PATH: exit $?"
[ "$got" = $'--max_idle_secs=60\ninfo' ] || fail "another checkout's wrapper: got [$got]"
if out=$(PATH="$shim_dir:/nonexistent" /bin/bash "$shim_dir/bazel" info 2>&1); then
  fail "without a real bazel it succeeded: $out"
else
  grep -qF "no bazel on PATH" <<<"$out" || fail "without a real bazel: unexpected message: $out"
fi
if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "zf_bazel_test: all checks passed"
