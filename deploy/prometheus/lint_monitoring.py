#!/usr/bin/env python3
"""lint_monitoring: static checks of the ZenFlow dashboard, alerts and scrape config.

    deploy/prometheus/lint_monitoring.py [--spec FILE] [--dashboard FILE]
        [--rules FILE] [--rules-test FILE] [--config FILE]

Defaults: the files of deploy/ (../METRICS_SPEC.md, ../grafana/zenflow.json,
and rules.yml, rules_test.yml, prometheus.yml beside this script).

What it checks (each problem is a line on stderr; exit status 1 if any):
- the dashboard parses; schemaVersion is a number >= 36; it has the
  template variables `datasource` (type datasource, query prometheus), and
  `job` and `rank` as label_values() of zenflow_job_world_size or
  zenflow_worker_steps_total; every panel has a unique id, a gridPos inside
  the 24 columns that overlaps no other panel, the datasource ${datasource},
  and targets that all have an expr (at least one);
- every expression (panel targets, the selectors of label_values()
  variables, rules): each metric is a name of METRICS_SPEC.md, the
  _bucket/_sum/_count of one of its histograms, or `up`; each label in a
  selector is one of that metric's labels in the spec (or instance, job, le
  for a _bucket); each label in by/without/on/ignoring is a label of some
  metric; a variable is the dashboard's or Grafana's ($__rate_interval...),
  and a dashboard variable is used only with =~ or !~ (they are
  multi-value); a panel selects per-rank series by job=~"$job" and
  rank=~"$rank", per-job series by job=~"$job", daemon-wide series and `up`
  by instance=~"$instance";
- every rule is an alert with `for`, labels.severity critical or warning,
  annotations summary, description (saying "What to do:") and runbook
  docs/operating.md#alerts; alert names are unique;
- rules_test.yml loads rules.yml and has, for every alert, a test group in
  which it fires at one evaluation time and does not fire at an earlier one;
- prometheus.yml loads rules.yml, and every scrape job named in an
  up{job="..."} selector is a scrape job there with honor_labels: true (the
  dashboard and the alerts rely on the daemon's own `job` label; see the
  top of rules.yml).

It does not parse PromQL fully: promtool and check_rules.sh's real
Prometheus do; this finds names and labels that would only give empty
panels or alerts that never fire.
"""

import argparse
import os
import re
import sys

sys.dont_write_bytecode = True  # no __pycache__ beside the sources (Bazel runs them in place)
import extract_queries as xq  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

TOKEN = re.compile(r"""
    (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<num>\d[\w.]*|\.\d[\w.]*)                 # numbers and durations: 0.9, 1e9, 5m
  | (?P<var>\$\{\w+(?::[^}]*)?\}|\$\w+|\[\[\w+\]\])  # Grafana's, e.g. [$__rate_interval]
  | (?P<ident>[A-Za-z_:][\w:]*)
  | (?P<op>=~|!~|!=|==|>=|<=|[{}()\[\],=<>+\-*/%^@])
  | (?P<ws>\s+)
""", re.X)
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
                "bottomk", "topk", "quantile"}
KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"} | GROUPING
# Labels every scraped series may have: the target's (with honor_labels, a
# daemon-wide series gets job="zenflowd").
TARGET_LABELS = {"instance", "job"}


def parse_spec(path):
    """{metric: its labels} from METRICS_SPEC.md, and the set of histograms.

    A name's labels are those in braces after it (`zenflow_x{job,transport}`),
    else those of its section ("Per job (label `job`...", "Per worker rank
    ... (labels `job`, `rank`)"; daemon-wide: none)."""
    labels, histograms, section = {}, set(), set()
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("Daemon-wide"):
                section = set()
            elif line.startswith("Per job"):
                section = {"job"}
            elif line.startswith("Per worker rank"):
                section = {"job", "rank"}
            for m in re.finditer(r"`(zenflow_\w+)(?:\{([\w,\s]*)\})?`(\s+histogram)?", line):
                name, own, histogram = m.groups()
                labels[name] = {l.strip() for l in own.split(",")} if own else set(section)
                if histogram:
                    histograms.add(name)
    return labels, histograms


def series_labels(spec_labels, histograms):
    """{series name a query may use: its own labels (not the target's)}."""
    out = {"up": set()}
    for name, labels in spec_labels.items():
        out[name] = labels
        if name in histograms:
            out[name + "_bucket"] = labels | {"le"}
            out[name + "_sum"] = labels
            out[name + "_count"] = labels
    return out


def selectors(expr):
    """([(metric or None, [(label, op, value)])], grouping labels) of an expression."""
    toks = []
    pos = 0
    while pos < len(expr):
        m = TOKEN.match(expr, pos)
        if not m:
            raise xq.Error("cannot read %r at %r" % (expr, expr[pos:pos + 20]))
        if m.lastgroup != "ws":
            toks.append((m.lastgroup, m.group()))
        pos = m.end()
    toks.append(("end", ""))

    def matchers(i):  # toks[i] is "{"; the matchers and the index after "}"
        out = []
        i += 1
        while toks[i][1] != "}":
            label, op, value = toks[i][1], toks[i + 1][1], toks[i + 2]
            if toks[i][0] != "ident" or value[0] != "str":
                raise xq.Error("cannot read the matchers of %r" % expr)
            out.append((label, op, value[1][1:-1]))
            i += 3
            if toks[i][1] == ",":
                i += 1
        return out, i + 1

    sels, grouping = [], set()
    i = 0
    while toks[i][0] != "end":
        kind, val = toks[i]
        nxt = toks[i + 1][1]
        if kind == "ident" and val in GROUPING and nxt == "(":
            i += 2
            while toks[i][1] != ")" and toks[i][0] != "end":
                if toks[i][0] == "ident":
                    grouping.add(toks[i][1])
                i += 1
            i += 1
        elif kind == "ident" and (nxt == "(" or val.lower() in KEYWORDS
                                  or (val in AGGREGATIONS and nxt in GROUPING)):
            i += 1  # a function, an aggregation or a keyword
        elif kind == "ident":
            m, i = matchers(i + 1) if nxt == "{" else ([], i + 1)
            sels.append((val, m))
        elif val == "{":
            m, i = matchers(i)
            sels.append((None, m))
        else:
            i += 1
    return sels, grouping


def check_expr(source, expr, kind, own, problems):
    """Names, labels and variables of one expression as written; own is
    series_labels()."""
    try:
        sels, grouping = selectors(expr)
    except (xq.Error, IndexError) as e:
        problems.append("%s: %s" % (source, e))
        return []
    if not sels:
        problems.append("%s: no metric in %r" % (source, expr))
    known = set().union(TARGET_LABELS, *own.values())
    for label in sorted(grouping - known):
        problems.append("%s: grouping label %r is no metric's label" % (source, label))
    for metric, matchers in sels:
        if metric is None:
            problems.append("%s: a selector without a metric name in %r" % (source, expr))
            continue
        if metric not in own:
            problems.append("%s: %s is not a metric of METRICS_SPEC.md" % (source, metric))
            continue
        for label, op, value in matchers:
            if label not in own[metric] | TARGET_LABELS:
                problems.append("%s: %s has no label %r" % (source, metric, label))
            if "$" in value and op not in ("=~", "!~"):
                problems.append("%s: %s%s%r: a multi-value variable needs =~" % (source, label, op, value))
        if kind == "panel":
            if "rank" in own[metric]:  # per rank
                need = [("job", "=~", "$job"), ("rank", "=~", "$rank")]
            elif "job" in own[metric]:  # per job
                need = [("job", "=~", "$job")]
            else:  # daemon-wide, up
                need = [("instance", "=~", "$instance")]
            for n in need:
                if n not in matchers:
                    problems.append("%s: %s should be selected with %s%s\"%s\"" % ((source, metric) + n))
    return sels


def label_values_metric(query):
    m = re.match(r"^\s*label_values\(\s*([A-Za-z_:][\w:]*)[^,]*,\s*(\w+)\s*\)\s*$", query)
    return m.groups() if m else (None, None)


def check_dashboard(d, problems):
    if not isinstance(d.get("schemaVersion"), int) or d["schemaVersion"] < 36:
        problems.append("dashboard: schemaVersion %r (want a current one, >= 36)" % d.get("schemaVersion"))
    variables = {v.get("name"): v for v in d.get("templating", {}).get("list", [])}
    ds = variables.get("datasource", {})
    if ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        problems.append("dashboard: no template variable datasource of type datasource, query prometheus")
    for name in ("job", "rank"):
        metric, label = label_values_metric(xq.variable_query(variables.get(name, {})))
        if metric not in ("zenflow_job_world_size", "zenflow_worker_steps_total") or label != name:
            problems.append("dashboard: variable %s is not label_values(zenflow_job_world_size or "
                            "zenflow_worker_steps_total, %s)" % (name, name))
    for v in variables.values():
        if v.get("type") == "query" and v.get("datasource") != DATASOURCE:
            problems.append("dashboard: variable %s does not use ${datasource}" % v.get("name"))
    ids, boxes = set(), []
    for p in xq.all_panels(d.get("panels", [])):
        where = "dashboard panel %s %r" % (p.get("id"), p.get("title"))
        if not isinstance(p.get("id"), int) or p["id"] in ids:
            problems.append("%s: id missing or not unique" % where)
        ids.add(p.get("id"))
        g = p.get("gridPos", {})
        if not all(isinstance(g.get(k), int) for k in "hwxy") or g["w"] < 1 or g["h"] < 1 \
                or g["x"] < 0 or g["y"] < 0 or g["x"] + g["w"] > 24:
            problems.append("%s: gridPos %r is not a box inside the 24 columns" % (where, g))
        else:
            for other, og in boxes:
                if g["x"] < og["x"] + og["w"] and og["x"] < g["x"] + g["w"] \
                        and g["y"] < og["y"] + og["h"] and og["y"] < g["y"] + g["h"]:
                    problems.append("%s: overlaps %s" % (where, other))
            boxes.append((where, g))
        if p.get("datasource") != DATASOURCE:
            problems.append("%s: datasource is %r, not %r" % (where, p.get("datasource"), DATASOURCE))
        targets = p.get("targets", [])
        if not targets:
            problems.append("%s: no targets" % where)
        refs = [t.get("refId") for t in targets]
        if len(set(refs)) != len(refs):
            problems.append("%s: refIds %r are not unique" % (where, refs))
        for t in targets:
            if not str(t.get("expr", "")).strip():
                problems.append("%s: target %s has no expr" % (where, t.get("refId")))
            if "datasource" in t and t["datasource"] != DATASOURCE:
                problems.append("%s: target %s datasource is %r" % (where, t.get("refId"), t["datasource"]))
    return len(ids)


def seconds(duration):
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", str(duration)))


def check_rules(rules, problems):
    names = []
    for g in rules.get("groups", []):
        for r in g.get("rules", []):
            where = "rules.yml %s" % (r.get("alert") or r.get("record"))
            if "alert" not in r:
                problems.append("%s: not an alert" % where)
                continue
            names.append(r["alert"])
            a = r.get("annotations", {})
            if "for" not in r:
                problems.append("%s: no for:" % where)
            if r.get("labels", {}).get("severity") not in ("critical", "warning"):
                problems.append("%s: labels.severity is not critical or warning" % where)
            for k in ("summary", "description"):
                if not str(a.get(k, "")).strip():
                    problems.append("%s: no annotations.%s" % (where, k))
            if "What to do:" not in str(a.get("description", "")):
                problems.append("%s: the description does not say what to do" % where)
            if a.get("runbook") != "docs/operating.md#alerts":
                problems.append("%s: annotations.runbook is %r, not docs/operating.md#alerts" % (where, a.get("runbook")))
    for n in sorted({n for n in names if names.count(n) > 1}):
        problems.append("rules.yml: alert %s is defined twice" % n)
    return sorted(set(names))


def check_rules_test(tests, alerts, problems):
    if "rules.yml" not in [os.path.basename(f) for f in tests.get("rule_files", [])]:
        problems.append("rules_test.yml: does not load rules.yml")
    for alert in alerts:
        covered = False
        for group in tests.get("tests", []):
            cases = [c for c in group.get("alert_rule_test", []) if c.get("alertname") == alert]
            fires = [seconds(c["eval_time"]) for c in cases if c.get("exp_alerts")]
            quiet = [seconds(c["eval_time"]) for c in cases if not c.get("exp_alerts")]
            if fires and quiet and min(quiet) < max(fires):
                covered = True
        if not covered:
            problems.append("rules_test.yml: no test group in which %s fires and, at an earlier "
                            "evaluation time, does not fire" % alert)


def check_config(config, scrape_jobs, problems):
    if "rules.yml" not in [os.path.basename(f) for f in config.get("rule_files", [])]:
        problems.append("prometheus.yml: rule_files does not load rules.yml")
    honored = {s.get("job_name") for s in config.get("scrape_configs", []) if s.get("honor_labels") is True}
    for job in sorted(scrape_jobs):
        if job not in honored:
            problems.append("prometheus.yml: no scrape job %r with honor_labels: true, and the queries "
                            "select up{job=%r}" % (job, job))


def main():
    up = os.path.join(HERE, "..")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default=os.path.join(up, "METRICS_SPEC.md"))
    ap.add_argument("--dashboard", default=os.path.join(up, "grafana", "zenflow.json"))
    ap.add_argument("--rules", default=os.path.join(HERE, "rules.yml"))
    ap.add_argument("--rules-test", default=os.path.join(HERE, "rules_test.yml"))
    ap.add_argument("--config", default=os.path.join(HERE, "prometheus.yml"))
    args = ap.parse_args()
    problems = []
    try:
        spec_labels, histograms = parse_spec(args.spec)
        dashboard = xq.load_json(args.dashboard)
        rules = xq.load_yaml(args.rules)
        tests = xq.load_yaml(args.rules_test)
        config = xq.load_yaml(args.config)
    except (OSError, xq.Error) as e:
        sys.stderr.write("lint_monitoring: %s\n" % e)
        return 2
    if len(spec_labels) < 30 or len(histograms) != 3:
        problems.append("%s: read %d metrics and %d histograms; has its format changed?"
                        % (args.spec, len(spec_labels), len(histograms)))
    own = series_labels(spec_labels, histograms)

    panels = check_dashboard(dashboard, problems)
    alerts = check_rules(rules, problems)
    check_rules_test(tests, alerts, problems)
    queries = xq.dashboard_queries(dashboard) + xq.rules_queries(rules)
    values = xq.dashboard_variables(dashboard)
    scrape_jobs = set()
    for q in queries:
        try:
            xq.substitute(q["expr"], values)
        except xq.Error as e:
            problems.append("%s: %s" % (q["source"], e))
        for metric, matchers in check_expr(q["source"], q["expr"], q["kind"], own, problems):
            scrape_jobs |= {v for l, op, v in matchers if metric == "up" and l == "job" and op == "="}
    check_config(config, scrape_jobs, problems)

    for p in problems:
        sys.stderr.write("lint_monitoring: %s\n" % p)
    print("lint_monitoring: %d panels, %d expressions, %d alerts, %d spec metrics: %d problems"
          % (panels, len(queries), len(alerts), len(spec_labels), len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
