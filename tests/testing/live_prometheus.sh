# Sourced by the tests that run zenflowd under a real Prometheus
# (tests:metrics_live_test, tests:dashboard_browser_test). Needs $dir (the
# test's scratch directory) and $ZENFLOWD; everything listens on 127.0.0.1.
#
#   live_start_zenflowd            zenflowd with --metrics_listen; sets zpid,
#                                  T (its gRPC address), M (its /metrics)
#   live_start_prometheus [ARGS]   Prometheus scraping M every second as the
#                                  scrape job zenflowd with honor_labels (as
#                                  deploy/prometheus/prometheus.yml does);
#                                  $LIVE_RULES, when set, is loaded as its
#                                  rule file; ARGS go to prometheus. Sets
#                                  ppid, P (its address); returns once it
#                                  has scraped zenflowd
#   live_scraped                   the time of its last successful scrape of
#                                  zenflowd (unix seconds; 0: none yet)
#   live_stop                      stops both (the caller's EXIT trap)
#   get URL, free_port             the body of URL; a free loopback port

zpid="" ppid=""
get() { python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' "$1"; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

live_start_zenflowd() {
  "$ZENFLOWD" --listen=127.0.0.1:0 --port_file="$dir/port" --metrics_listen=127.0.0.1:0 \
    --metrics_port_file="$dir/mport" 2>"$dir/zenflowd.log" &
  zpid=$!
  for _ in $(seq 1 300); do [ -s "$dir/port" ] && [ -s "$dir/mport" ] && break; sleep 0.1; done
  [ -s "$dir/port" ] && [ -s "$dir/mport" ] || { echo "zenflowd did not start"; cat "$dir/zenflowd.log"; exit 1; }
  T="127.0.0.1:$(cat "$dir/port")"
  M="127.0.0.1:$(cat "$dir/mport")"
}

live_scraped() {
  get "http://$P/api/v1/query?query=timestamp(up%7Bjob%3D%22zenflowd%22%7D%20%3D%3D%201)" |
    python3 -c 'import json, sys; r = json.load(sys.stdin)["data"]["result"]; print(int(float(r[0]["value"][1])) if r else 0)'
}

live_start_prometheus() {
  P="127.0.0.1:$(free_port)"
  {
    echo "global: {scrape_interval: 1s, evaluation_interval: 1s}"
    [ -z "${LIVE_RULES:-}" ] || echo "rule_files: [\"$LIVE_RULES\"]"
    echo "scrape_configs:"
    echo "  - job_name: zenflowd   # the name the rules, the dashboard and the consoles expect"
    echo "    honor_labels: true   # the daemon's job label (the training job) wins"
    echo "    static_configs: [{targets: [\"$M\"]}]"
  } >"$dir/prometheus.yml"
  prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/tsdb" \
    --web.listen-address="$P" "$@" >"$dir/prometheus.log" 2>&1 &
  ppid=$!
  for _ in $(seq 1 600); do get "http://$P/-/ready" >/dev/null 2>&1 && break; sleep 0.1; done
  get "http://$P/-/ready" >/dev/null || { echo "Prometheus did not start"; tail "$dir/prometheus.log"; exit 1; }
  # Prometheus takes a few seconds to hand new targets to its scraper.
  for _ in $(seq 1 600); do [ "$(live_scraped)" != 0 ] && break; sleep 0.1; done
  [ "$(live_scraped)" != 0 ] || { echo "Prometheus never scraped zenflowd"; tail "$dir/prometheus.log"; exit 1; }
}

live_stop() {
  [ -n "$ppid" ] && kill -TERM "$ppid" 2>/dev/null && wait "$ppid" 2>/dev/null
  [ -n "$zpid" ] && kill -TERM "$zpid" 2>/dev/null && wait "$zpid" 2>/dev/null
  return 0
}
