#!/usr/bin/env bash
# tools/json_get: values at key paths, the ZF_SUMMARY line form, and exit
# status 2 with nothing on stdout for every kind of bad read.
set -euo pipefail
if [ -n "${TEST_SRCDIR:-}" ]; then
  J="$TEST_SRCDIR/$TEST_WORKSPACE/tools/json_get"
else
  J="$(dirname "$0")/json_get"  # run by hand
fi
dir=$(mktemp -d "${TEST_TMPDIR:-/tmp}/json_get.XXXXXX")
failures=0

# expect NAME WANT ARGS...: json_get ARGS prints WANT and exits 0.
expect() {
  local name=$1 want=$2; shift 2
  local got rc=0
  got=$("$J" "$@" 2>"$dir/err") || rc=$?
  if [ "$rc" -ne 0 ] || [ "$got" != "$want" ]; then
    echo "FAIL $name: got '$got' (exit $rc), want '$want'; stderr: $(cat "$dir/err")"
    failures=$((failures + 1))
  fi
}

# refuse NAME MESSAGE ARGS...: json_get ARGS exits 2, prints nothing on
# stdout and MESSAGE (a substring) on stderr.
refuse() {
  local name=$1 message=$2; shift 2
  local got rc=0
  got=$("$J" "$@" 2>"$dir/err") || rc=$?
  if [ "$rc" -ne 2 ] || [ -n "$got" ] || ! grep -qF -- "$message" "$dir/err"; then
    echo "FAIL $name: exit $rc, stdout '$got', stderr '$(cat "$dir/err")'; want exit 2 and '$message'"
    failures=$((failures + 1))
  fi
}

cat > "$dir/doc.json" <<'JSON'
{
  "params": 83520,
  "ratio": 0.986456,
  "big": 3387300000.0,
  "device": "cpu",
  "quoted": "a \"b\" \\ c\u00e9",
  "ok": true,
  "missing": null,
  "goals": {"speedup": 3, "wire_ratio": 0.5},
  "runs": [{"k": 0.05, "delay": "sync"}, {"k": 0.1, "delay": "1"}]
}
JSON

expect integer 83520 "$dir/doc.json" params
expect double 0.986456 "$dir/doc.json" ratio
expect big_double 3387300000.0 "$dir/doc.json" big
expect string cpu "$dir/doc.json" device
expect escaped_string 'a "b" \ cé' "$dir/doc.json" quoted
expect bool true "$dir/doc.json" ok
expect null null "$dir/doc.json" missing
expect nested 0.5 "$dir/doc.json" goals.wire_ratio
expect object '{"speedup":3,"wire_ratio":0.5}' "$dir/doc.json" goals
expect array_index 1 "$dir/doc.json" runs.1.delay
expect several "$(printf '83520\ncpu\n3')" "$dir/doc.json" params device goals.speedup
expect stdin 7 - a <<<'{"a": 7}'

printf 'zf_train: mode=zenflow\nZF_SUMMARY {"val_loss":2.9,"mode":"old"}\nprogress\nZF_SUMMARY {"val_loss":2.5019,"mode":"zenflow"}\n' > "$dir/train.out"
expect summary_line "$(printf '2.5019\nzenflow')" --line=ZF_SUMMARY "$dir/train.out" val_loss mode

refuse missing_key "no 'nope' in the top level" "$dir/doc.json" nope
refuse missing_nested "no 'x' in goals" "$dir/doc.json" goals.x
refuse through_a_number "no 'x' in params" "$dir/doc.json" params.x
refuse index_out_of_range "no '2' in runs" "$dir/doc.json" runs.2
refuse one_bad_of_several "no 'nope'" "$dir/doc.json" params nope
refuse not_json "is not JSON" - a <<<'{"a": 1'
refuse nan "NaN is not a JSON value" - a <<<'{"a": NaN}'
refuse empty "is not JSON" - a </dev/null
refuse no_file "cannot read $dir/absent.json" "$dir/absent.json" a
refuse no_summary_line "no line starting with 'ZF_SUMMARY '" --line=ZF_SUMMARY - a <<<'no summary here'
refuse no_path "usage" "$dir/doc.json"

if [ "$failures" -ne 0 ]; then
  echo "$failures json_get case(s) failed"
  exit 1
fi
echo "json_get test passed"
