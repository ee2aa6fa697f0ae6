#!/usr/bin/env python3
"""extract_queries: every PromQL expression of the ZenFlow dashboard and alerts.

    deploy/prometheus/extract_queries.py [--dashboard FILE] [--rules FILE]
    deploy/prometheus/extract_queries.py --prometheus URL [--allow-empty]

Prints one JSON object a line, {"source": ..., "expr": ...}, for each query
of the Grafana dashboard (every panel target, and the series selector of
each label_values() template variable) and each rule of the rules file.
Defaults: ../grafana/zenflow.json and rules.yml beside this script.

Grafana's variables are replaced so that each expression runs as it is in
Prometheus: a dashboard variable by its "All" value (allValue, ".+" here:
the dashboard uses them only in =~ matchers), $__rate_interval and
$__interval by 1m, $__range by 1h. An unknown variable is an error.
Line breaks inside an expression become spaces.

--prometheus URL (e.g. http://127.0.0.1:9090): instead of printing the
expressions, run each as an instant query against that Prometheus and print
{"source", "expr", "series": N} or {"source", "expr", "error": ...}; then
read its rules (/api/v1/rules) and report each rule of the rules file that
is missing there or not healthy. The exit status is 1 when a query fails, a
rule is missing or unhealthy, or a dashboard query returns no series (a
panel that would be empty); --allow-empty accepts empty dashboard queries
(a daemon without jobs has no per-job series). Alert expressions may always
be empty: they are empty while nothing is wrong.

Exit status 2 for a file that cannot be read or parsed, or an unknown
variable.
"""

import argparse
import json
import os
import re
import signal
import sys
import urllib.error
import urllib.parse
import urllib.request

import yaml  # Debian: python3-yaml

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DASHBOARD = os.path.join(HERE, "..", "grafana", "zenflow.json")
DEFAULT_RULES = os.path.join(HERE, "rules.yml")

# Grafana's built-in interval variables, as a Prometheus query would get
# them for a 1-hour view with a 15 s scrape interval.
BUILTINS = {
    "__rate_interval": "1m",
    "__interval": "1m",
    "__interval_ms": "60000",
    "__range": "1h",
    "__range_s": "3600",
    "__range_ms": "3600000",
}

# $name, ${name}, ${name:format} and [[name]].
VARIABLE = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\$(\w+)|\[\[(\w+)\]\]")

# label_values(selector, label): the selector is an expression of its own.
LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*\w+\s*\)\s*$", re.S)


class Error(Exception):
    pass


def load_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise Error("cannot read %s: %s" % (path, e))


def load_yaml(path):
    try:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        raise Error("cannot read %s: %s" % (path, e))


def one_line(expr):
    return re.sub(r"\s*\n\s*", " ", expr).strip()


def all_panels(panels):
    """The panels, and those nested in collapsed rows."""
    for p in panels:
        yield p
        yield from all_panels(p.get("panels", []))


def dashboard_variables(dashboard):
    """{name: value to put in its place} for the dashboard's own variables."""
    values = {}
    for v in dashboard.get("templating", {}).get("list", []):
        values[v["name"]] = v.get("allValue") or ".+"
    return values


def variable_query(v):
    q = v.get("query")
    return q.get("query", "") if isinstance(q, dict) else (q or "")


def dashboard_queries(dashboard, name="zenflow.json"):
    """[{"source", "expr" as written, "kind": "panel" or "variable"}]."""
    out = []
    for p in all_panels(dashboard.get("panels", [])):
        for t in p.get("targets", []):
            if t.get("expr"):
                source = "%s panel %s %r target %s" % (name, p.get("id"), p.get("title", ""), t.get("refId", ""))
                out.append({"source": source, "expr": t["expr"], "kind": "panel"})
    for v in dashboard.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        m = LABEL_VALUES.match(variable_query(v))
        if m:
            out.append({"source": "%s variable %s" % (name, v["name"]), "expr": m.group(1), "kind": "variable"})
    return out


def rules_queries(rules, name="rules.yml"):
    """[{"source", "expr", "kind": "alert" or "record", "name"}] of a rules file."""
    out = []
    for g in (rules or {}).get("groups", []):
        for r in g.get("rules", []):
            kind = "alert" if "alert" in r else "record"
            source = "%s group %s %s %s" % (name, g.get("name"), kind, r.get(kind))
            out.append({"source": source, "expr": str(r.get("expr", "")), "kind": kind, "name": r.get(kind)})
    return out


def substitute(expr, values):
    def replace(m):
        var = m.group(1) or m.group(2) or m.group(3)
        if var in BUILTINS:
            return BUILTINS[var]
        if var in values:
            return values[var]
        raise Error("unknown variable $%s in: %s" % (var, one_line(expr)))

    return one_line(VARIABLE.sub(replace, expr))


def extract(dashboard_path, rules_path):
    """Every query of both files, runnable: the variables replaced, on one line."""
    dashboard = load_json(dashboard_path)
    values = dashboard_variables(dashboard)
    out = dashboard_queries(dashboard, os.path.basename(dashboard_path))
    for q in out:
        q["expr"] = substitute(q["expr"], values)
    for q in rules_queries(load_yaml(rules_path), os.path.basename(rules_path)):
        q["expr"] = one_line(q["expr"])
        out.append(q)
    return out


def api_get(base, path, params=None):
    url = base.rstrip("/") + path
    if params:
        url += "?" + urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        # Prometheus answers a bad query with 400 and a JSON error body.
        try:
            return json.load(e)
        except ValueError:
            return {"status": "error", "error": "HTTP %d" % e.code}
    except (OSError, ValueError) as e:
        return {"status": "error", "error": str(e)}


def check_live(base, queries, allow_empty):
    """Runs the queries and reads the rules' health; returns the failures."""
    failures = 0
    for q in queries:
        body = api_get(base, "/api/v1/query", {"query": q["expr"]})
        line = {"source": q["source"], "expr": q["expr"]}
        if body.get("status") != "success":
            line["error"] = body.get("error", "no answer")
            failures += 1
        else:
            line["series"] = len(body["data"]["result"])
            if line["series"] == 0 and q["kind"] in ("panel", "variable") and not allow_empty:
                line["error"] = "no series"
                failures += 1
        print(json.dumps(line), flush=True)
    body = api_get(base, "/api/v1/rules")
    loaded = {}
    for g in body.get("data", {}).get("groups", []):
        for r in g.get("rules", []):
            loaded[r["name"]] = r
    for name in (q["name"] for q in queries if "name" in q):
        r = loaded.get(name)
        if r is None:
            print(json.dumps({"rule": name, "error": "not loaded by this Prometheus"}))
            failures += 1
        elif r.get("health") != "ok":
            print(json.dumps({"rule": name, "error": "health %s: %s" % (r.get("health"), r.get("lastError", ""))}))
            failures += 1
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dashboard", default=DEFAULT_DASHBOARD)
    ap.add_argument("--rules", default=DEFAULT_RULES)
    ap.add_argument("--prometheus", help="run the queries against this Prometheus (base URL)")
    ap.add_argument("--allow-empty", action="store_true", help="with --prometheus: dashboard queries may return nothing")
    args = ap.parse_args()
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # | head: stop quietly
    try:
        queries = extract(args.dashboard, args.rules)
    except Error as e:
        sys.stderr.write("extract_queries: %s\n" % e)
        return 2
    if not args.prometheus:
        for q in queries:
            print(json.dumps({"source": q["source"], "expr": q["expr"]}))
        return 0
    failures = check_live(args.prometheus, queries, args.allow_empty)
    sys.stderr.write("extract_queries: %d queries against %s, %d failures\n"
                     % (len(queries), args.prometheus, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
