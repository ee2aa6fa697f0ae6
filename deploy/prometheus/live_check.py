#!/usr/bin/env python3
"""live_check: the `job` label collision, in a real Prometheus (check_rules.sh).

    live_check.py config PROMETHEUS_YML TARGET CONTROL_TARGET OUT_YML
    live_check.py check URL TARGET CONTROL_TARGET

config: writes OUT_YML, a copy of PROMETHEUS_YML (the example config) that
scrapes every second and evaluates rules every second, whose zenflowd scrape
job, honor_labels and all, scrapes TARGET (a server of a sample of
zenflowd's /metrics), plus a scrape job control-no-honor-labels that
scrapes the same sample at CONTROL_TARGET (another name for it, so that its
series have another instance) with Prometheus' default, honor_labels: false.

check: waits (up to 60 s) until the Prometheus at URL has scraped TARGET
three times and evaluated every rule, then checks what it stored:
- up{job="zenflowd"} is 1 for TARGET;
- TARGET's per-job and per-rank series carry the training job ids of the
  sample in `job` (llama-ft, demo), its daemon-wide series job="zenflowd",
  and none has an exported_job label;
- the control's per-job series have job="control-no-honor-labels" and the
  ids in exported_job: what the dashboard and rules would get without
  honor_labels;
- no alert is pending or firing (ALERTS is empty): the sample is a
  healthy daemon, and the daemon-down alerts see its `up`.
Prints what it checked; exit status 1 on a mismatch.
"""

import json
import sys
import time

import yaml

sys.dont_write_bytecode = True  # no __pycache__ beside the sources (Bazel runs them in place)
import extract_queries as xq  # noqa: E402

CONTROL_JOB = "control-no-honor-labels"
TRAINING_JOBS = ["demo", "llama-ft"]
RANKS = [("demo", "0"), ("llama-ft", "0"), ("llama-ft", "1")]


def write_config(src, target, control_target, out):
    config = xq.load_yaml(src)
    config.setdefault("global", {}).update({"scrape_interval": "1s", "evaluation_interval": "1s"})
    jobs = [s for s in config["scrape_configs"] if s.get("job_name") == "zenflowd"]
    if len(jobs) != 1:
        raise xq.Error("%s has no scrape job zenflowd" % src)
    job = jobs[0]
    job.pop("scrape_interval", None)
    for key in [k for k in job if k.endswith("_sd_configs")]:
        del job[key]  # service discovery: replaced by the sample's address
    job["static_configs"] = [{"targets": [target]}]
    control = {k: v for k, v in job.items() if k != "honor_labels"}
    control["job_name"] = CONTROL_JOB
    control["static_configs"] = [{"targets": [control_target]}]
    config["scrape_configs"] = [job, control]
    with open(out, "w", encoding="utf-8") as f:
        yaml.safe_dump(config, f, sort_keys=False)


def query(url, expr):
    body = xq.api_get(url, "/api/v1/query", {"query": expr})
    if body.get("status") != "success":
        raise xq.Error("%s: %s" % (expr, body.get("error")))
    return body["data"]["result"]


def wait_ready(url, target):
    deadline = time.time() + 60
    while True:
        try:
            scrapes = query(url, 'count_over_time(up{job="zenflowd", instance="%s"}[1m])' % target)
            groups = xq.api_get(url, "/api/v1/rules").get("data", {}).get("groups", [])
            rules = [r for g in groups for r in g["rules"]]
            if scrapes and float(scrapes[0]["value"][1]) >= 3 and rules \
                    and all(r.get("health") != "unknown" for r in rules):
                return
        except xq.Error:
            pass  # not serving yet
        if time.time() > deadline:
            raise xq.Error("Prometheus at %s did not scrape %s three times and evaluate its rules "
                           "within 60 s" % (url, target))
        time.sleep(0.5)


def check(url, target, control_target):
    failures = []

    def expect(what, expr, got_of, want):
        got = got_of(query(url, expr))
        ok = got == want
        print("%s %s: %s -> %s" % ("ok  " if ok else "FAIL", what, expr, json.dumps(got)))
        if not ok:
            failures.append("%s: got %s, want %s" % (what, json.dumps(got), json.dumps(want)))

    def labels(*names):
        return lambda result: sorted([s["metric"].get(n, "") for n in names] for s in result)

    def values(result):
        return sorted(s["value"][1] for s in result)

    wait_ready(url, target)
    expect("the daemon's scrape health", 'up{job="zenflowd", instance="%s"}' % target, values, ["1"])
    expect("per-job series keep the training job's id in job",
           'zenflow_job_world_size{instance="%s"}' % target, labels("job"), [[j] for j in TRAINING_JOBS])
    expect("per-rank series keep job and rank",
           'zenflow_worker_steps_total{instance="%s"}' % target, labels("job", "rank"), [list(r) for r in RANKS])
    expect("daemon-wide series get the scrape job's name",
           'zenflow_memory_budget_bytes{instance="%s"}' % target, labels("job"), [["zenflowd"]])
    expect("nothing is renamed exported_job",
           'count({instance="%s", exported_job=~".+"})' % target, values, [])
    expect("without honor_labels, the ids would be in exported_job",
           'zenflow_job_world_size{instance="%s"}' % control_target, labels("job", "exported_job"),
           [[CONTROL_JOB, j] for j in TRAINING_JOBS])
    expect("no alert is pending or firing", "ALERTS", labels("alertname", "alertstate"), [])
    for f in failures:
        sys.stderr.write("live_check: %s\n" % f)
    return 1 if failures else 0


def main():
    try:
        if len(sys.argv) == 6 and sys.argv[1] == "config":
            write_config(*sys.argv[2:])
            return 0
        if len(sys.argv) == 5 and sys.argv[1] == "check":
            return check(*sys.argv[2:])
    except xq.Error as e:
        sys.stderr.write("live_check: %s\n" % e)
        return 1
    sys.stderr.write(__doc__.split("\n\n")[1] + "\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())
