#!/usr/bin/env bash
# zfctl against a real zenflowd (docs/operating.md#zfctl) on loopback and its
# admin socket under $TEST_TMPDIR, with two jobs of two tokens:
#  - over the admin socket (this test's uid is the daemon's): jobs lists
#    both, stats shows the daemon-wide figures, describe, checkpoint and
#    delete work without a token; ZENFLOW_ADMIN_SOCKET alone finds it;
#  - with a job token over gRPC: only that job, the daemon-wide figures
#    "hidden" (never "0 B of the 0 B budget"), another's job refused with
#    what to do;
#  - --json: json.loads parses it, counts are numbers, every rank has its
#    rank (rank 0 too), withheld figures are null;
#  - a peer of another uid (nobody, 65534; root only) is refused:
#    PERMISSION_DENIED from the credential check even when the file mode lets
#    it connect, and an audit line names its uid;
#  - --help exits 0; usage errors exit 2; the socket file goes at exit.
set -euo pipefail
R="$TEST_SRCDIR/$TEST_WORKSPACE"
ZENFLOWD="$R/server/zenflowd"
ZFCTL="$R/tools/zfctl/zfctl"
ZF_STATS="$R/tools/zf_stats"
MAKE_JOB="$R/tests/zfctl_job"
dir=$(mktemp -d "$TEST_TMPDIR/zfctl.XXXXXX")
mkdir -p "$dir/state"
# $TEST_TMPDIR's path is longer than a unix socket's (108 bytes): the daemon
# and zfctl run in $dir and name the socket relative to it.
cd "$dir"
sock=admin.sock
dpid=""
cleanup() {
  touch "$dir/release"
  [ -n "$dpid" ] && kill -TERM "$dpid" 2>/dev/null && wait "$dpid" 2>/dev/null
  for p in $(jobs -p); do kill "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- zenflowd log"; cat "$dir/zenflowd.log"; exit 1; }

"$ZENFLOWD" --listen=127.0.0.1:0 --port_file="$dir/port" --state_dir="$dir/state" --ucx=false \
  --admin_socket="$sock" 2>"$dir/zenflowd.log" &
dpid=$!
for _ in $(seq 1 300); do [ -s "$dir/port" ] && break; sleep 0.1; done
[ -s "$dir/port" ] || fail "zenflowd did not start"
T="127.0.0.1:$(cat "$dir/port")"
grep -q "admin socket $sock" "$dir/zenflowd.log" || fail "no admin socket line"
mode=$(stat -c %a "$sock")
[ "$mode" = 660 ] || fail "admin socket mode $mode, want 660"

# Job alpha: two ranks, 3 rounds, rank 0 stays attached. Job beta: another
# token, 1 round, every rank gone.
"$MAKE_JOB" --target="$T" --job=alpha --rounds=3 --token_out="$dir/alpha.token" \
  --release="$dir/release" 2>"$dir/alpha.err" &
"$MAKE_JOB" --target="$T" --job=beta --rounds=1 --token_out="$dir/beta.token" 2>"$dir/beta.err" ||
  { cat "$dir/beta.err"; fail "job beta"; }
for _ in $(seq 1 600); do [ -s "$dir/alpha.token" ] && break; sleep 0.1; done
[ -s "$dir/alpha.token" ] || { cat "$dir/alpha.err"; fail "job alpha"; }

# --- Over the admin socket: the admin, no token. (The daemon sees a rank's
# stream end a moment after its process let go: wait for it.)
for _ in $(seq 1 100); do
  "$ZFCTL" jobs --admin_socket="$sock" >"$dir/jobs.txt" || fail "zfctl jobs"
  grep -Eq '^alpha +zenflow +1/2 ' "$dir/jobs.txt" && grep -Eq '^beta +zenflow +0/2 ' "$dir/jobs.txt" &&
    break
  sleep 0.1
done
cat "$dir/jobs.txt"
grep -Eq '^alpha +zenflow +1/2 +3 +128 ' "$dir/jobs.txt" || fail "jobs: alpha's line"
grep -Eq '^beta +zenflow +0/2 +1 +128 .*idle' "$dir/jobs.txt" || fail "jobs: beta's line"
# No flags at all: ZENFLOW_ADMIN_SOCKET (as /run/zenflowd/admin.sock would be) is found.
ZENFLOW_ADMIN_SOCKET="$sock" "$ZFCTL" stats >"$dir/stats_admin.txt" || fail "zfctl stats (socket)"
cat "$dir/stats_admin.txt"
grep -Eq 'jobs hold [0-9.]+ [KMG]i?B of the [0-9.]+ GiB budget' "$dir/stats_admin.txt" ||
  fail "the admin's stats lack the budget"
grep -q 'jobs: 2 of at most 64' "$dir/stats_admin.txt" || fail "the admin's stats lack max_jobs"
grep -q '^job alpha:' "$dir/stats_admin.txt" && grep -q '^job beta:' "$dir/stats_admin.txt" ||
  fail "the admin's stats lack a job"
"$ZFCTL" describe alpha --admin_socket="$sock" >"$dir/describe.txt" || fail "zfctl describe"
cat "$dir/describe.txt"
grep -q 'mode zenflow, world size 2; parameters uploaded: yes; ranks joined: 0, 1' \
  "$dir/describe.txt" || fail "describe: spec line"
grep -q 'tensors (1): w \[8 x 16\]' "$dir/describe.txt" || fail "describe: tensors"
grep -q 'rounds: 3 done' "$dir/describe.txt" || fail "describe: rounds"
"$ZFCTL" checkpoint alpha --admin_socket="$sock" >"$dir/ckpt.txt" || fail "zfctl checkpoint"
cat "$dir/ckpt.txt"
grep -q 'checkpointed job alpha at round 3' "$dir/ckpt.txt" || fail "checkpoint line"
f=$(sed -n 's/.* round 3: \([^ ]*\) .*/\1/p' "$dir/ckpt.txt")
[ -s "$f" ] || fail "no checkpoint file $f"

# --- With a job token over gRPC: its job only, daemon-wide figures hidden.
"$ZFCTL" stats --target="$T" --token_file="$dir/alpha.token" >"$dir/stats_token.txt" ||
  fail "zfctl stats (token)"
cat "$dir/stats_token.txt"
grep -q 'hidden' "$dir/stats_token.txt" || fail "no 'hidden' in a token's stats"
grep -Eq ' 0 B of the 0 B budget|of at most 0' "$dir/stats_token.txt" && fail "withheld figures print as 0"
grep -q '^job beta' "$dir/stats_token.txt" && fail "alpha's token sees beta"
# zf_stats (the former name) prints the same.
"$ZF_STATS" --target="$T" --token_file="$dir/alpha.token" >"$dir/stats_old.txt" || fail "zf_stats"
diff <(grep -v 'memory\|cpu\|age' "$dir/stats_token.txt") <(grep -v 'memory\|cpu\|age' "$dir/stats_old.txt") ||
  fail "zf_stats and zfctl stats differ"
if "$ZFCTL" describe alpha --target="$T" --token_file="$dir/beta.token" 2>"$dir/denied.err"; then
  fail "beta's token described alpha"
fi
cat "$dir/denied.err"
grep -q 'PERMISSION_DENIED' "$dir/denied.err" && grep -q 'what to do:' "$dir/denied.err" ||
  fail "a refusal without its status or what to do"
if "$ZFCTL" jobs --target="$T" 2>"$dir/notoken.err"; then fail "jobs without a token"; fi
grep -q 'UNAUTHENTICATED' "$dir/notoken.err" && grep -q 'admin socket' "$dir/notoken.err" ||
  fail "no token: the message does not point at the admin socket"

# --- JSON: numbers, every rank's rank, withheld figures null.
"$ZFCTL" stats --admin_socket="$sock" --json >"$dir/admin.json" || fail "stats --json (socket)"
"$ZFCTL" stats --target="$T" --token_file="$dir/alpha.token" --json >"$dir/token.json" ||
  fail "stats --json (token)"
python3 - "$dir/admin.json" "$dir/token.json" <<'PY' || fail "JSON checks"
import json, sys
admin = json.loads(open(sys.argv[1]).read())
token = json.loads(open(sys.argv[2]).read())
def is_num(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)
for key in ("memory_budget_bytes", "memory_reserved_bytes", "resident_bytes", "max_jobs",
            "max_outbox_bytes"):
    assert is_num(admin[key]), (key, admin[key])
assert admin["memory_budget_bytes"] > 0 and admin["max_jobs"] == 64
assert admin["daemon_wide_withheld"] is False
jobs = {j["job_id"]: j for j in admin["jobs"]}
assert set(jobs) == {"alpha", "beta"}, jobs.keys()
a = jobs["alpha"]
for key in ("rounds_updated", "params", "shards_received", "memory_bytes", "state_bytes"):
    assert is_num(a[key]), (key, a[key])
assert a["rounds_updated"] == 3 and a["params"] == 128, a
ranks = a["ranks"]
assert len(ranks) == 2 and all("rank" in r for r in ranks), ranks
assert sorted(r["rank"] for r in ranks) == [0, 1], ranks
for r in ranks:
    assert is_num(r["next_round"]) and is_num(r["outbox_bytes"]), r
# A job token: alpha only, the daemon-wide figures null, never 0.
assert token["daemon_wide_withheld"] is True
assert [j["job_id"] for j in token["jobs"]] == ["alpha"]
for key in ("memory_budget_bytes", "max_jobs", "resident_bytes", "cpu_seconds"):
    assert token[key] is None, (key, token[key])
assert all("rank" in r for r in token["jobs"][0]["ranks"])
print("ok  JSON: numbers are numbers, every rank has its rank, withheld figures are null")
PY

# --- Delete over the socket; the admin learns that it is gone.
"$ZFCTL" delete beta --admin_socket="$sock" || fail "zfctl delete"
"$ZFCTL" jobs --admin_socket="$sock" >"$dir/jobs2.txt" || fail "zfctl jobs after delete"
grep -q '^beta ' "$dir/jobs2.txt" && fail "beta still listed"
if "$ZFCTL" describe beta --admin_socket="$sock" 2>"$dir/gone.err"; then fail "beta described"; fi
grep -q 'NOT_FOUND' "$dir/gone.err" || { cat "$dir/gone.err"; fail "deleted job: not NOT_FOUND"; }

# --- A peer of another uid. The child chdirs to the socket's directory and
# opens zfctl before it drops to nobody (this test's tree is root's alone),
# then execs zfctl on the relative socket path.
if [ "$(id -u)" = 0 ]; then
  as_nobody() {
    python3 - "$dir" "$ZFCTL" "$@" <<'PY'
import os, sys
d, exe, args = sys.argv[1], sys.argv[2], sys.argv[3:]
pid = os.fork()
if pid == 0:
    os.chdir(d)
    fd = os.open(os.path.realpath(exe), os.O_RDONLY)
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    os.execve(fd, ["zfctl"] + args, {"PATH": "/usr/bin:/bin"})
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
PY
  }
  chmod 0711 "$dir"
  # The file mode (0660, root's group) keeps nobody out before the daemon sees it.
  if as_nobody stats --admin_socket=admin.sock 2>"$dir/nobody1.err"; then fail "nobody got in"; fi
  cat "$dir/nobody1.err"
  grep -q 'may not open' "$dir/nobody1.err" || fail "nobody (file mode): unclear error"
  # With the file open to all, the peer's credentials still keep it out.
  chmod 0666 "$sock"
  if as_nobody stats --admin_socket=admin.sock 2>"$dir/nobody2.err"; then fail "nobody got in"; fi
  cat "$dir/nobody2.err"
  grep -q 'PERMISSION_DENIED' "$dir/nobody2.err" || fail "nobody: not PERMISSION_DENIED"
  grep -q 'admits only root and the daemon' "$dir/nobody2.err" || fail "nobody: no reason"
  grep -q 'you are uid 65534' "$dir/nobody2.err" || fail "nobody: no uid in the hint"
  grep -q 'call=admin socket.*uid 65534' "$dir/zenflowd.log" || fail "no audit line for nobody"
  if as_nobody delete alpha --admin_socket=admin.sock 2>/dev/null; then fail "nobody deleted"; fi
  "$ZFCTL" jobs --admin_socket="$sock" >"$dir/jobs3.txt" || fail "zfctl jobs"
  grep -q '^alpha ' "$dir/jobs3.txt" || fail "alpha is gone"
  echo "ok  a peer of uid 65534 is refused"
else
  echo "SKIP: the peer-credential check needs root to become another user (uid $(id -u))"
fi

# --- Help and usage errors.
"$ZFCTL" --help >"$dir/help.txt" || fail "zfctl --help: not exit 0"
grep -q 'checkpoint' "$dir/help.txt" || fail "zfctl --help lacks a subcommand"
"$ZFCTL" stats --help >"$dir/help.txt" || fail "zfctl stats --help: not exit 0"
grep -q -- '--target' "$dir/help.txt" || fail "zfctl stats --help lacks --target"
"$ZF_STATS" --help >/dev/null || fail "zf_stats --help"
set +e
"$ZFCTL" describe 2>/dev/null; [ $? = 2 ] || fail "describe without JOB: not exit 2"
"$ZFCTL" frobnicate 2>/dev/null; [ $? = 2 ] || fail "an unknown subcommand: not exit 2"
set -e

# --- The socket file goes with the daemon.
touch "$dir/release"
kill -TERM "$dpid"; wait "$dpid" 2>/dev/null || true; dpid=""
[ ! -e "$sock" ] || fail "the admin socket outlived the daemon"
echo PASS
