#!/usr/bin/env python3
"""Opens Prometheus pages in headless Chromium and checks what they draw.

Drives Debian's chromium through Debian's chromedriver (the W3C WebDriver
protocol over HTTP on 127.0.0.1, spoken here with urllib: no other package).
For each page given:
  - loads it, waits until every graph on it has drawn or said it has no data;
  - fails on any error in the browser's console (a script error, a request
    that failed: a 404 of a script or stylesheet included);
  - counts, per graph, the series drawn as SVG paths with at least two points
    (in the DOM, not by pixels) and fails when a graph required to draw
    has none;
  - writes a screenshot of the whole page (PNG).
Prints one line per graph and a JSON summary line (CONSOLE_SHOT {...}).

  console_shot.py --base=http://127.0.0.1:9090 \
      --page='/consoles/zenflow.html?window=10s' --out=overview.png \
      [--page=PATH --out=FILE ...] [--range=START,END] [--require=all|ID,ID|none]

--range (unix seconds) sets every console graph's time range (the
#pctc{...} of Prometheus's console library). --require applies to the
console pages (graphs in div.zf_graph_node); the Prometheus graph page
(/graph?...) is checked for drawn series in its graph area, and its console
errors are printed as notices (Debian's own page logs one: its popper.js is
an ES module loaded as a plain script).
"""

import argparse
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

# Counts, per console graph, the series drawn: SVG paths whose "d" has two
# or more points (path commands: a move and a segment at least) (Rickshaw's line renderer draws one path per series; a
# series without points has an empty or one-point path), the legend's rows,
# and whether the graph said "No timeseries returned" or "Error loading".
GRAPH_STATE_JS = r"""
function drawn(root) {
  var n = 0;
  root.querySelectorAll('svg path').forEach(function (p) {
    var d = p.getAttribute('d') || '';
    if ((d.match(/[MLCHVSQTA]/gi) || []).length >= 2 && p.getAttribute('class') !== 'domain') n++;
  });
  return n;
}
var out = [];
document.querySelectorAll(arguments[0]).forEach(function (g, i) {
  var err = g.querySelector('.prom_graph_error');
  var loading = g.querySelector('.prom_graph_loading');
  out.push({id: g.id || ('graph' + i), series: drawn(g),
            legend: g.parentNode.querySelectorAll('.rickshaw_legend li, .legend li').length,
            error: err ? err.textContent : null, loading: !!loading,
            hasSvg: !!g.querySelector('svg')});
});
return {graphs: out, height: Math.max(document.body.scrollHeight, document.documentElement.scrollHeight),
        title: document.title};
"""


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class WebDriver:
    """The few WebDriver calls this needs, over HTTP to chromedriver."""

    def __init__(self, chromedriver, chromium, workdir):
        self.port = free_port()
        self.log = open(os.path.join(workdir, "chromedriver.log"), "w")
        # chromium writes $HOME/.config/chromium (crash reports) whatever
        # its --user-data-dir, and org.chromium.Chromium.scoped_dir.* in
        # $TMPDIR: give it and chromedriver a home and a TMPDIR inside the
        # work directory, which is removed at the end (./zf test fails on
        # anything left in its TMPDIR).
        # The TMPDIR is a short path of its own (chromium puts unix sockets
        # there, and TEST_TMPDIR is too long for a socket's name); close()
        # removes it.
        home = os.path.join(workdir, "home")
        os.makedirs(home, exist_ok=True)
        tmp = self.tmp = tempfile.mkdtemp(prefix="zf-chromium.")
        env = dict(os.environ, HOME=home, TMPDIR=tmp, XDG_CONFIG_HOME=os.path.join(home, ".config"),
                   XDG_CACHE_HOME=os.path.join(home, ".cache"))
        self.proc = subprocess.Popen(
            [chromedriver, "--port=%d" % self.port, "--allowed-ips=127.0.0.1"],
            stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.base = "http://127.0.0.1:%d" % self.port
        deadline = time.time() + 20
        while True:
            try:
                if self._call("GET", "/status")["ready"]:
                    break
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError("chromedriver did not start (log: %s)" % self.log.name)
            time.sleep(0.1)
        caps = {"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:loggingPrefs": {"browser": "ALL"},
            "goog:chromeOptions": {
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--no-first-run", "--disable-extensions", "--disable-background-networking",
                         "--user-data-dir=" + os.path.join(workdir, "profile"),
                         "--window-size=1400,1000", "--hide-scrollbars", "--force-device-scale-factor=1"],
            }}}}
        self.session = self._call("POST", "/session", caps)["sessionId"]

    def _call(self, method, path, body=None, timeout=60):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read().decode())["value"]
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")
            raise RuntimeError("WebDriver %s %s: HTTP %d: %s" % (method, path, e.code, detail[:2000]))

    def s(self, method, path, body=None):
        return self._call(method, "/session/%s%s" % (self.session, path), body)

    def get(self, url):
        self.s("POST", "/url", {"url": url})

    def run(self, script, *args):
        return self.s("POST", "/execute/sync", {"script": script, "args": list(args)})

    def console(self):
        """The browser's console entries since the last call."""
        return self.s("POST", "/se/log", {"type": "browser"})

    def resize(self, width, height):
        self.s("POST", "/window/rect", {"width": width, "height": height})

    def screenshot(self, path, width, height):
        """The page's top WIDTH x HEIGHT CSS pixels, beyond the viewport too
        (Chrome DevTools' Page.captureScreenshot, through chromedriver)."""
        shot = self.s("POST", "/goog/cdp/execute", {"cmd": "Page.captureScreenshot", "params": {
            "format": "png", "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}}})
        with open(path, "wb") as f:
            f.write(base64.b64decode(shot["data"]))

    def close(self):
        try:
            self._call("DELETE", "/session/%s" % self.session, timeout=20)
        except Exception:  # the browser may be gone already; chromedriver goes below
            pass
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def check_page(wd, url, out, selector, require, timeout_s, width, console_errors_fail):
    wd.resize(width, 1000)
    wd.get(url)
    deadline = time.time() + timeout_s
    while True:
        state = wd.run(GRAPH_STATE_JS, selector)
        graphs = state["graphs"]
        settled = graphs and all(g["error"] or (g["hasSvg"] and not g["loading"]) for g in graphs)
        if settled or time.time() > deadline:
            break
        time.sleep(0.2)
    time.sleep(0.3)  # the last graph's axes and legend
    state = wd.run(GRAPH_STATE_JS, selector)
    wd.screenshot(out, width, min(max(state["height"], 400), 4000))
    errors = []
    for entry in wd.console():
        if entry.get("level") in ("SEVERE", "ERROR"):
            errors.append(entry.get("message", ""))
    problems = []
    if not state["graphs"]:
        problems.append("no graph on the page (selector %s)" % selector)
    for g in state["graphs"]:
        want = require == "all" or (require not in ("none", "") and g["id"] in require.split(","))
        print("  graph %-24s series drawn %2d, legend %2d%s" % (
            g["id"], g["series"], g["legend"], ", says: " + g["error"] if g["error"] else ""))
        if want and g["series"] == 0:
            problems.append("graph %s drew no series (%s)" % (g["id"], g["error"] or "no data"))
    for e in errors:
        if console_errors_fail:
            problems.append("browser console: " + e)
        else:
            print("  notice: browser console: " + e)
    return {"url": url, "png": out, "png_bytes": os.path.getsize(out), "title": state["title"],
            "graphs": state["graphs"], "console_errors": errors, "problems": problems}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="Prometheus' URL, http://127.0.0.1:PORT")
    ap.add_argument("--page", action="append", required=True, help="a path under --base")
    ap.add_argument("--out", action="append", required=True, help="the PNG of each --page, in order")
    ap.add_argument("--range", default="", help="START,END (unix seconds) of every console graph")
    ap.add_argument("--require", default="all",
                    help="console graphs that must draw a series: all, none or ID,ID (default all)")
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--timeout_s", type=float, default=20)
    ap.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    ap.add_argument("--chromedriver", default=shutil.which("chromedriver") or "/usr/bin/chromedriver")
    a = ap.parse_args()
    if len(a.page) != len(a.out):
        ap.error("give one --out per --page")
    for tool in (a.chromium, a.chromedriver):
        if not os.access(tool, os.X_OK):
            sys.exit("console_shot: %s is missing: ./zf setup installs chromium and chromium-driver" % tool)
    pctc = ""
    if a.range:
        start, end = (float(x) for x in a.range.split(","))
        pctc = "#pctc" + json.dumps({"duration": max(int(end - start), 1), "endTime": end})
    work = tempfile.mkdtemp(prefix="console_shot.", dir=os.environ.get("TEST_TMPDIR"))
    wd = None
    results = []
    try:
        wd = WebDriver(a.chromedriver, a.chromium, work)
        for page, out in zip(a.page, a.out):
            console_page = page.startswith("/consoles/")
            url = a.base.rstrip("/") + page + (pctc if console_page else "")
            print("page %s" % url)
            r = check_page(wd, url, out, "div.zf_graph_node" if console_page else "#graph_container .graph_area, .graph_area",
                           a.require if console_page else "all", a.timeout_s, a.width, console_page)
            print("  screenshot %s (%d bytes)" % (out, r["png_bytes"]))
            for p in r["problems"]:
                print("  PROBLEM " + p)
            results.append(r)
    finally:
        if wd:
            wd.close()
        shutil.rmtree(work, ignore_errors=True)
    print("CONSOLE_SHOT " + json.dumps(results))
    return 1 if any(r["problems"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
