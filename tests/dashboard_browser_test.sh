#!/usr/bin/env bash
# The stall consoles (deploy/prometheus/consoles), seen in a real browser: a
# real zenflowd with --metrics_listen, a real Prometheus on loopback serving
# the consoles and scraping the daemon every second, and two zf_train ranks
# (zenflow mode, update_interval auto, one over gRPC and one over UCX, 40 ms
# of emulated device time per step so that there is stall to draw). Then
# Debian's chromium, headless, driven through Debian's chromedriver
# (tools/console_shot.py) opens the overview console, the job's console and
# Prometheus's own graph page for the stall fraction:
#  - a console page that logs an error in the browser's console (a script
#    error, a file that failed to load) fails the test;
#  - every graph of both console pages must hold a drawn series (SVG paths
#    in the DOM), the job's per-rank graphs one per rank, and the overview's
#    table must list the job and link its page;
#  - each page's screenshot is kept as a test artifact (Bazel's
#    test.outputs: bazel-testlogs/tests/dashboard_browser_test/test.outputs/).
# Missing chromium or chromedriver fails the test: ./zf setup installs them.
# Everything listens on 127.0.0.1 on ports chosen free at run time.
set -euo pipefail
export ZENFLOW_TOKEN="${ZENFLOW_TOKEN:-$(head -c 24 /dev/urandom | base64 | tr '+/' '-_')}"
R="$TEST_SRCDIR/$TEST_WORKSPACE"
ZENFLOWD="$R/server/zenflowd"
TRAIN="$R/gpu_worker/zf_train"
STATS="$R/tools/zf_stats"
SHOT="$R/tools/console_shot.py"
CONSOLES="$R/deploy/prometheus/consoles"
LIBRARIES="$R/deploy/prometheus/console_libraries"
for tool in prometheus python3 chromium chromedriver; do
  command -v "$tool" >/dev/null || {
    echo "FAIL: $tool is missing (./zf setup installs prometheus, chromium and chromium-driver)"; exit 1; }
done
dir=$(mktemp -d "${TEST_TMPDIR:-/tmp}/browser.XXXXXX")
shots="${TEST_UNDECLARED_OUTPUTS_DIR:-$dir}"
mkdir -p "$shots"
# zenflowd, and Prometheus scraping it every second with the consoles
# (tests/testing/live_prometheus.sh): so that a short run has points to draw.
source "$R/tests/testing/live_prometheus.sh"
trap 'live_stop; rm -rf "$dir"' EXIT
now() { date +%s; }
live_start_zenflowd
live_start_prometheus --web.console.templates="$CONSOLES" --web.console.libraries="$LIBRARIES"
start=$(now)

# A refused request, for the rejections graph.
if "$STATS" --target="$T" --job='not an id!' >/dev/null 2>"$dir/refused.err"; then
  echo "GetStats of a malformed job id should fail"; exit 1
fi

job=browser-$$
common=(--job="$job" --keep_job --world=2 --target="$T" --width=32 --layers=1 --heads=2 --context=32
  --batch=4 --threads=1 --progress=false --steps=96 --interval=auto --emulate_device_ms=40)
"$TRAIN" --mode=zenflow --rank=0 --transport=grpc "${common[@]}" >"$dir/r0.out" 2>"$dir/r0.err" &
r0=$!
"$TRAIN" --mode=zenflow --rank=1 --transport=ucx "${common[@]}" >"$dir/r1.out" 2>"$dir/r1.err" &
r1=$!
wait "$r1" || { cat "$dir/r1.err"; exit 1; }
wait "$r0" || { cat "$dir/r0.err"; exit 1; }
end=$(now)
# Two more scrapes: the final figures are in.
for _ in $(seq 1 100); do [ "$(live_scraped)" -ge $((end + 2)) ] && break; sleep 0.2; done
echo "run: $((end - start)) s of training (job $job); opening the consoles"

# Prometheus's own graph page for the stall fraction of each rank, since the
# rank's start (a rate would be 0/0 once the run is over: the page's range
# ends now, not at the run's end).
stall='sum by (job, rank) (zenflow_worker_stall_seconds_total) / sum by (job, rank) (zenflow_worker_step_seconds_total)'
graph="/graph?g0.expr=$(python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1]))' "$stall")&g0.tab=0&g0.range_input=2m"
rc=0
shot_start=$(now)
python3 "$SHOT" --base="http://$P" --range="$((start - 5)),$((end + 5))" \
  --page="/consoles/zenflow.html?window=10s" --out="$shots/overview.png" \
  --page="/consoles/zenflow-job.html?job=$job&window=10s" --out="$shots/job.png" \
  --page="$graph" --out="$shots/prometheus-graph.png" >"$dir/shot.out" 2>&1 || rc=$?
grep -v '^CONSOLE_SHOT ' "$dir/shot.out"
echo "browser: $(($(now) - shot_start)) s for chromium and the three pages"
[ "$rc" -eq 0 ] || { echo "FAIL: console_shot.py exited $rc"; exit 1; }

grep '^CONSOLE_SHOT ' "$dir/shot.out" | sed 's/^CONSOLE_SHOT //' >"$dir/shot.json"
python3 - "$dir/shot.json" "$job" "http://$P" <<'PY'
import json, sys, urllib.request
pages = json.load(open(sys.argv[1]))
job, base = sys.argv[2], sys.argv[3]
overview, job_page, graph = pages
def graphs(page):
    return {g["id"]: g for g in page["graphs"]}
for page in (overview, job_page):
    assert not page["console_errors"], page["console_errors"]
    assert len(page["graphs"]) >= 6, [g["id"] for g in page["graphs"]]
    for g in page["graphs"]:
        assert g["series"] >= 1 and not g["error"], (page["url"], g)
# One series per rank in the per-rank graphs; S; the apply delay; both
# transports' bytes, up and down.
j = graphs(job_page)
for gid in ("zf_rank_stall", "zf_rank_stall_fraction", "zf_rank_send_blocked"):
    assert j[gid]["series"] == 2, (gid, j[gid])
assert j["zf_interval"]["series"] == 1 and j["zf_apply_delay"]["series"] == 1, (j["zf_interval"], j["zf_apply_delay"])
assert j["zf_job_bytes"]["series"] == 4, j["zf_job_bytes"]
assert graphs(overview)["zf_stall_per_step"]["series"] == 1, graphs(overview)["zf_stall_per_step"]
assert graph["graphs"] and graph["graphs"][0]["series"] >= 2, graph["graphs"]
for page in pages:
    assert page["png_bytes"] > 10000 and open(page["png"], "rb").read(8) == b"\x89PNG\r\n\x1a\n", page
# The overview's table lists the job and links its console; that page names it.
html = urllib.request.urlopen(base + "/consoles/zenflow.html?window=10s", timeout=10).read().decode()
assert ("/consoles/zenflow-job.html?job=%s&amp;window=10s" % job) in html, "the overview does not link the job"
html = urllib.request.urlopen(base + "/consoles/zenflow-job.html?job=%s" % job, timeout=10).read().decode()
assert '<span id="zf_job">%s</span>' % job in html and "/consoles/zenflow.html" in html
notices = graph["console_errors"]
print("ok  both consoles: every graph drew, no browser console error; job graphs: %s" %
      ", ".join("%s %d" % (k, v["series"]) for k, v in sorted(j.items())))
if notices:
    print("notice: Prometheus's own /graph page logged (Debian's packaging, not the consoles): %s" % notices)
PY
ls -l "$shots"/*.png
echo PASS
