#!/usr/bin/env bash
# tools/demo.sh's flags (./zf demo): --help shows the names with
# underscores, as zf_train's flags are spelt, and names int8 and the default
# of --wire; the dashed spellings of the same names set the same settings;
# an unknown flag is refused with its name as given. Runs only the argument
# check (ZF_DEMO_CHECK_ARGS), so nothing is built or started.
set -euo pipefail
demo="$TEST_SRCDIR/$TEST_WORKSPACE/tools/demo.sh"
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

help=$("$demo" --help) || fail "--help exited $?"
for want in "--kill_daemon_at=STEP" "--emulate_device_ms=N" "--pretrain_data=PATH" \
  "--wire=fp32|bf16|fp16|int8" "int8 shards for zenflow"; do
  grep -qF -- "$want" <<<"$help" || fail "--help does not show '$want'"
done
for gone in "--kill-daemon-at=" "--emulate-device-ms=" "--pretrain-data="; do
  grep -qF -- "$gone" <<<"$help" && fail "--help still shows '$gone'"
done

# settings ARGS...: what the arguments set, one NAME=VALUE a line.
settings() { ZF_DEMO_CHECK_ARGS=print "$demo" "$@"; }
for spelling in underscores dashes; do
  if [ "$spelling" = underscores ]; then
    args=(--steps=20 --kill_daemon_at=7 --emulate_device_ms=3 --pretrain_data=/a-b/c-d.txt --param_dtype=bf16)
  else
    args=(--steps=20 --kill-daemon-at=7 --emulate-device-ms=3 --pretrain-data=/a-b/c-d.txt --param-dtype=bf16)
  fi
  got=$(settings "${args[@]}") || fail "$spelling: refused: $got"
  for want in steps=20 kill_at=7 emulate=3 pretrain_data=/a-b/c-d.txt param_dtype=bf16; do
    grep -qxF "$want" <<<"$got" || fail "$spelling: no '$want' in: $got"
  done
done

# The checks after parsing apply to either spelling.
for flag in --kill_daemon_at --kill-daemon-at; do
  if out=$(settings --steps=10 "$flag=10" 2>&1); then
    fail "$flag=10 with --steps=10 passed"
  elif ! grep -qF -- "--kill_daemon_at must be a step in [1, --steps)" <<<"$out"; then
    fail "$flag=10: unexpected message: $out"
  fi
done
# --dashboard: shown in --help, set, and refused with --target (it scrapes
# the demo's own daemons).
grep -qF -- "--dashboard" <<<"$help" || fail "--help does not show --dashboard"
got=$(settings --dashboard) || fail "--dashboard refused: $got"
grep -qxF "dashboard=1" <<<"$got" || fail "--dashboard: no 'dashboard=1' in: $got"
grep -qxF "dashboard=0" <<<"$(settings)" || fail "no --dashboard: dashboard is not 0"
if out=$(settings --dashboard --target=127.0.0.1:1 2>&1); then
  fail "--dashboard with --target passed"
else
  grep -qF -- "--dashboard scrapes the demo's own daemons" <<<"$out" || fail "--dashboard --target: unexpected message: $out"
fi
if out=$(settings --no-such-flag=1 2>&1); then
  fail "an unknown flag passed"
else
  grep -qF "unknown option --no-such-flag=1" <<<"$out" || fail "unknown flag: unexpected message: $out"
fi

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "demo_args_test: all checks passed"
