#!/usr/bin/env bash
# zenflowd's metrics, live: a real zenflowd with --metrics_listen, a real
# Prometheus on loopback scraping it every second (with the alert rules
# loaded), and a two-rank zf_train run (one rank over gRPC, one over UCX).
# Checks:
#  - `promtool check metrics` on a scrape of the daemon, and of rank 1's own
#    /metrics (zf_train --metrics_listen), prints nothing;
#  - the scrape agrees with GetStats (zf_stats --json) and with what the
#    workers say they sent: the daemon's stall, step time and steps per rank
#    equal the ranks' reported figures; the shard payload bytes it received
#    equal the bytes the ranks sent, and the deltas (and bytes) it wrote equal
#    those the ranks received;
#  - every expression of the Grafana dashboard and of the alert rules runs in
#    Prometheus, every dashboard query returns data, and every rule is loaded
#    and healthy (deploy/prometheus/extract_queries.py --prometheus).
# Everything listens on 127.0.0.1 and is stopped at the end.
set -euo pipefail
# The job token every zf_train rank and zf_stats call of this run carries
# (zenflowd requires one; docs/security.md).
export ZENFLOW_TOKEN="${ZENFLOW_TOKEN:-$(head -c 24 /dev/urandom | base64 | tr '+/' '-_')}"
R="$TEST_SRCDIR/$TEST_WORKSPACE"
ZENFLOWD="$R/server/zenflowd"
TRAIN="$R/gpu_worker/zf_train"
STATS="$R/tools/zf_stats"
DASHBOARD="$R/deploy/grafana/zenflow.json"
RULES="$R/deploy/prometheus/rules.yml"
EXTRACT="$R/deploy/prometheus/extract_queries.py"
for tool in prometheus promtool python3; do
  command -v "$tool" >/dev/null || { echo "$tool is missing (./zf setup installs it)"; exit 1; }
done
dir=$(mktemp -d "${TEST_TMPDIR:-/tmp}/metrics.XXXXXX")
# zenflowd and Prometheus on loopback (tests/testing/live_prometheus.sh).
source "$R/tests/testing/live_prometheus.sh"
trap 'live_stop; rm -rf "$dir"' EXIT
live_start_zenflowd
LIVE_RULES="$RULES" live_start_prometheus

# A refused request, so that the rejections panel has a series to show.
if "$STATS" --target="$T" --job='not an id!' >/dev/null 2>"$dir/refused.err"; then
  echo "GetStats of a malformed job id should fail"; exit 1
fi
grep -q INVALID_ARGUMENT "$dir/refused.err"

# --keep_job: the job stays after the run for the scrape and GetStats below.
common=(--job=m --keep_job --world=2 --target="$T" --width=32 --layers=1 --heads=2 --context=32 --batch=4
  --threads=1 --progress=false --steps=48 --interval=4 --select_interval=16 --emulate_device_ms=40)
"$TRAIN" --mode=zenflow --rank=0 --transport=grpc "${common[@]}" >"$dir/r0.out" 2>"$dir/r0.err" &
r0=$!
"$TRAIN" --mode=zenflow --rank=1 --transport=ucx --metrics_listen=127.0.0.1:0 \
  --metrics_port_file="$dir/w1port" "${common[@]}" >"$dir/r1.out" 2>"$dir/r1.err" &
r1=$!
# Rank 1 serves its own figures too (zf_train --metrics_listen): scrape it
# while it runs.
for _ in $(seq 1 600); do [ -s "$dir/w1port" ] && break; sleep 0.05; done
[ -s "$dir/w1port" ] || { echo "rank 1 did not serve its metrics"; cat "$dir/r1.err"; exit 1; }
get "http://127.0.0.1:$(cat "$dir/w1port")/metrics" >"$dir/worker.txt"
grep -q '^zenflow_worker_steps_total{job="m",rank="1"} ' "$dir/worker.txt" ||
  { echo "rank 1's /metrics lacks its steps:"; cat "$dir/worker.txt"; exit 1; }
lint=$(promtool check metrics <"$dir/worker.txt" 2>&1 || true)
[ -z "$lint" ] || { echo "promtool check metrics (rank 1):"; echo "$lint"; exit 1; }
wait "$r1" || { cat "$dir/r1.err"; exit 1; }
wait "$r0" || { cat "$dir/r0.err"; exit 1; }

# Let Prometheus take at least two more scrapes, so that every rate() has
# the final figures and two samples.
end=$(date +%s)
for _ in $(seq 1 300); do [ "$(live_scraped)" -ge $((end + 3)) ] && break; sleep 0.2; done

get "http://$M/metrics" >"$dir/metrics.txt"
lint=$(promtool check metrics <"$dir/metrics.txt" 2>&1 || true)
[ -z "$lint" ] || { echo "promtool check metrics:"; echo "$lint"; exit 1; }
"$STATS" --target="$T" --job=m --json >"$dir/stats.json"
# ./zf stats' readable form names the job and each rank's stall.
"$STATS" --target="$T" --job=m >"$dir/stats.txt"
grep -q '^job m: ' "$dir/stats.txt" && grep -q '^  rank 1: .*stall' "$dir/stats.txt" &&
  grep -q '^  update divergence: [0-9]' "$dir/stats.txt" ||
  { echo "zf_stats printed:"; cat "$dir/stats.txt"; exit 1; }
grep '^ZF_SUMMARY ' "$dir/r0.out" | sed 's/^ZF_SUMMARY //' >"$dir/r0.json"
grep '^ZF_SUMMARY ' "$dir/r1.out" | sed 's/^ZF_SUMMARY //' >"$dir/r1.json"

python3 - "$dir" <<'PY'
import json, re, sys
d = sys.argv[1]
series = {}
for line in open(f"{d}/metrics.txt"):
    if line.startswith("#") or not line.strip():
        continue
    m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$', line.strip())
    assert m, line
    labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
    series.setdefault(m.group(1), []).append((labels, float(m.group(4))))

def total(name, **want):
    return sum(v for l, v in series.get(name, []) if all(l.get(k) == x for k, x in want.items()))

def close(a, b, what):
    if abs(a - b) > 1e-9 * max(1.0, abs(a), abs(b)):
        sys.exit(f"{what}: daemon {a!r} != workers {b!r}")
    print(f"ok  {what}: {a}")

ranks = [json.load(open(f"{d}/r{r}.json")) for r in (0, 1)]
stats = json.load(open(f"{d}/stats.json"))
job = stats["jobs"][0]
for r, s in enumerate(ranks):
    rep = s["reported"]
    assert rep["steps"] >= 47, rep  # every step but possibly the last
    close(total("zenflow_worker_steps_total", job="m", rank=str(r)), rep["steps"], f"rank {r} steps")
    close(total("zenflow_worker_stall_seconds_total", job="m", rank=str(r)), rep["stall_seconds"],
          f"rank {r} stall seconds")
    close(total("zenflow_worker_step_seconds_total", job="m", rank=str(r)), rep["step_seconds"],
          f"rank {r} step seconds")
    close(total("zenflow_worker_up_bytes_total", job="m", rank=str(r)), rep["up_bytes"],
          f"rank {r} up bytes")
close(total("zenflow_worker_stall_seconds_total", job="m"),
      sum(s["reported"]["stall_seconds"] for s in ranks), "stall seconds, all ranks")
close(total("zenflow_job_received_bytes_total", job="m"),
      sum(s["shard_bytes_sent"] for s in ranks), "shard payload bytes")
close(total("zenflow_job_deltas_sent_total", job="m"),
      sum(s["deltas_received"] for s in ranks), "deltas")
close(total("zenflow_job_sent_bytes_total", job="m"),
      sum(s["delta_bytes_received"] for s in ranks), "delta bytes")
for t in ("grpc", "ucx"):
    assert total("zenflow_job_shards_received_total", job="m", transport=t) > 0, f"no {t} shards"
# The scrape and GetStats read the same figures.
close(total("zenflow_job_rounds_completed_total", job="m"), float(job["rounds_updated"]), "rounds (GetStats)")
close(total("zenflow_job_world_size", job="m"), 2, "world size")
w = {int(r.get("rank", 0)): r["worker"] for r in job["ranks"]}
for r in (0, 1):
    close(total("zenflow_worker_stall_seconds_total", job="m", rank=str(r)),
          float(w[r].get("stall_seconds", 0)), f"rank {r} stall (GetStats)")
# The update divergence (docs/design.md rule 14): the last round's in the
# scrape and GetStats; each rank's summary has the mean over its rounds.
assert "update_divergence" in job, "GetStats has no update divergence"
div = total("zenflow_job_update_divergence", job="m")
if abs(div - float(job["update_divergence"])) > 1e-6 * max(1.0, div):
    sys.exit(f"update divergence: scrape {div!r} != GetStats {job['update_divergence']!r}")
for r, s in enumerate(ranks):
    assert isinstance(s.get("divergence"), (int, float)) and s["divergence"] >= 0, (r, s.get("divergence"))
print(f"ok  update divergence: {div} (last round), ranks' mean {ranks[0]['divergence']}")
assert total("zenflow_rejections_total", code="INVALID_ARGUMENT", reason="get_stats") >= 1
assert total("zenflow_grpc_calls_total", method="GetStats", code="INVALID_ARGUMENT") >= 1
print("metrics agree with GetStats and with the workers")
PY

python3 "$EXTRACT" --dashboard "$DASHBOARD" --rules "$RULES" --prometheus "http://$P" >"$dir/queries.out" ||
  { cat "$dir/queries.out"; echo "a dashboard or rule query failed or returned nothing"; exit 1; }
echo "$(wc -l <"$dir/queries.out") dashboard and rule expressions ran in Prometheus"
echo PASS
