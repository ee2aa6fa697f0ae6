#!/usr/bin/env python3
"""The documentation check (./zf test runs it; ./zf docs --check alone).

Two halves, each optional on the command line:

  --refs      Every reference to the documentation resolves. It reads code
              comments and help text (.cc .h .cu .proto .py .sh .bzl BUILD
              files, ./zf, deploy's YAML and flag files) and the pages
              themselves (README.md, CHANGELOG.md, docs/*.md), and checks:
                - docs/PAGE.md exists, and docs/PAGE.md#anchor is a heading
                  of that page (mkdocs' slug rules) or an explicit id;
                - docs/design.md rule N (rules N-M, rules N, M and K) is a
                  "Rule N" heading of docs/design.md, and so is a bare
                  "rule N" in C++, proto and Python comments;
                - docs/PAGE.md "Section" and README "Section" name a heading
                  of that page;
                - nothing cites "DESIGN rule(s)", "DESIGN §N" or DESIGN.md,
                  a document that is not in the repository;
                - relative links in README.md and docs/ point to files that
                  exist, and repository paths the pages name (server/job.h,
                  tools/demo.sh, ...) exist;
                - every `./zf SUB` the pages show is a subcommand of ./zf
                  with a row in docs/index.md's command table, which says
                  what tests it.
  --examples  Every fenced python/sh/bash block of README.md and docs/ is
              marked, on one of the three lines before it, with
                <!-- zf-example: run -->         run here, against a real
                                                 zenflowd on 127.0.0.1
                <!-- zf-example: parse-only -->  only parsed (python compile,
                                                 bash -n); the page must say
                                                 so visibly, in a line that
                                                 starts with "*Not run by the
                                                 docs check" between the
                                                 marker and the block.
              "run" blocks run from the repository root with ZENFLOW_TARGET
              (host:port of a zenflowd this check starts from
              bazel-bin/server/zenflowd, as ./zf's start_daemon does) and
              ZENFLOWD set; Python runs through /usr/bin/python3 with
              PYTHONPATH=python:bazel-bin/python, as ./zf python does. A
              fenced block without a language whose first line is a command
              is an error: it must say what it is.

Exit status 0 when everything holds; 1 with one line per problem otherwise.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import unicodedata

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))

CODE_SUFFIXES = (".cc", ".h", ".cu", ".proto", ".py", ".sh", ".bzl", ".yml", ".yaml", ".flags")
CODE_NAMES = ("BUILD", "BUILD.bazel", "WORKSPACE", "zf")
# Where a bare "rule N" means a rule of docs/design.md.
RULE_SUFFIXES = (".cc", ".h", ".cu", ".proto", ".py")
DOC_PAGES = ["README.md", "CHANGELOG.md"]
TOP_DIRS = ("proto", "server", "client", "common", "gpu_worker", "python", "examples", "tools",
            "tests", "fuzz", "deploy", "bazel", "third_party", "docs")
EXAMPLE_LANGS = {"python": "python", "py": "python", "sh": "sh", "bash": "sh", "shell": "sh"}
COMMAND_START = re.compile(r"^\s*(\$ |\./zf\b|bazel\b|bazel-bin/|zenflowd\b|zf_train\b|python3?\b|"
                           r"kubectl\b|promtool\b|systemctl\b|sudo\b|curl\b)")
MARKER = re.compile(r"<!--\s*zf-example:\s*(run|parse-only)\s*-->")


def repo_files():
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split("\n")
    return [f for f in out if f and os.path.exists(os.path.join(ROOT, f))]


def doc_pages(files):
    pages = [f for f in DOC_PAGES if os.path.exists(os.path.join(ROOT, f))]
    pages += sorted(f for f in files if f.startswith("docs/") and f.endswith(".md"))
    return pages


# ---- headings and anchors, as mkdocs (Python-Markdown's toc) makes them ----

def slugify(text):
    text = re.sub(r"<[^>]+>", "", text)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def heading_text(raw):
    # What the heading shows: markup gone, link text kept.
    t = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", raw)
    return t.replace("`", "").replace("*", "").strip()


def fenced_lines(text):
    """Yields (line number, line, inside a fence)."""
    fence = None
    for i, line in enumerate(text.split("\n"), 1):
        m = re.match(r"^\s*(```+|~~~+)", line)
        if m:
            if fence is None:
                fence = m.group(1)
                yield i, line, True
                continue
            if line.strip().startswith(fence):
                fence = None
                yield i, line, True
                continue
        yield i, line, fence is not None


class Page:
    def __init__(self, path):
        self.path = path
        self.text = open(os.path.join(ROOT, path), encoding="utf-8").read()
        self.headings = []  # shown text
        self.anchors = set()
        self.rules = set()
        seen = {}
        for _, line, fenced in fenced_lines(self.text):
            if fenced:
                continue
            m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
            if m:
                text = heading_text(m.group(2))
                self.headings.append(text)
                slug = slugify(text)
                if slug in seen:
                    seen[slug] += 1
                    slug = "%s_%d" % (slug, seen[slug])
                else:
                    seen[slug] = 0
                self.anchors.add(slug)
                r = re.match(r"^Rule (\d+)\b", text)
                if r:
                    self.rules.add(int(r.group(1)))
            for a in re.findall(r"""\bid=["']([\w-]+)["']""", line):
                self.anchors.add(a)

    def has_section(self, name):
        want = re.sub(r"\s+", " ", name).strip().lower()
        return any(h.lower() == want for h in self.headings)


# ---- references ----

def joined_comment_text(text):
    # Comments and help strings wrap: join a line's continuation so that a
    # reference cut by a line break is read whole.
    text = text.replace('\\"', '"')
    text = re.sub(r'"\s*\n\s*"', "", text)                  # "a " "b" string pieces
    text = re.sub(r"\n[ \t]*(//+|#+|\*|--)[ \t]*", " ", text)  # comment continuations
    return re.sub(r"[ \t]+", " ", text)


def rule_numbers(spec):
    """'5-9' -> 5..9; '2, 3 and 8' -> 2, 3, 8."""
    nums = []
    for part in re.split(r",\s*|\s+and\s+|\s+or\s+", spec):
        m = re.match(r"^(\d+)\s*[-–]\s*(\d+)$", part.strip())
        if m:
            nums.extend(range(int(m.group(1)), int(m.group(2)) + 1))
        elif part.strip().isdigit():
            nums.append(int(part.strip()))
    return nums


RULES_SPEC = r"rules? ((?:\d+(?:\s*[-–]\s*\d+)?)(?:(?:,\s*|\s+and\s+|\s+or\s+)\d+(?:\s*[-–]\s*\d+)?)*)"
DOC_REF = re.compile(r"(?<![\w/.-])docs/([\w-]+)\.md(?:#([\w-]+))?(?:,? " + RULES_SPEC + r"| \"([^\"\n]{1,80})\")?")
README_REF = re.compile(r"\bREADME(?:\.md)?(?:'s)?(?:#([\w-]+)| \"([^\"\n]{1,80})\"|, \"([^\"\n]{1,80})\")")
DESIGN_REF = re.compile(r"\bDESIGN(?:\.md)?(?:'s)?\b(?: (?:rules? |§\s*)" + RULES_SPEC[7:] + r"| \d+\s*[-–]\s*\d+)?")
BARE_RULE = re.compile(r"(?<![\w.-])[Rr]" + RULES_SPEC[1:])


def check_refs(files, problems):
    pages = {p: Page(p) for p in doc_pages(files)}

    def page(name):
        if name not in pages and os.path.exists(os.path.join(ROOT, name)):
            pages[name] = Page(name)
        return pages.get(name)

    design = page("docs/design.md")
    sources = [f for f in files if f.endswith(CODE_SUFFIXES) or os.path.basename(f) in CODE_NAMES
               or (f.startswith("deploy/") and f.endswith(".md"))]
    # The check itself names the forms it checks; it is no reference.
    sources = [f for f in sources if not f.startswith(("third_party/", "fuzz/corpus/", "fuzz/regressions/"))
               and f != "tools/docs_check.py"]
    for f in sorted(set(sources) | set(pages)):
        raw = open(os.path.join(ROOT, f), encoding="utf-8", errors="replace").read()
        text = raw if f.endswith(".md") else joined_comment_text(raw)
        def where(m, f=f, raw=raw):
            # The match is in the joined text; find its line in the file by
            # its start (shorter when a line break cut it).
            for key in (m.group(0)[:20], m.group(0).replace('"', '\\"')[:20], m.group(0)[:12],
                        m.group(0)[:6]):
                at = raw.find(key)
                if at >= 0:
                    return "%s:%d" % (f, raw.count("\n", 0, at) + 1)
            return f
        for m in DOC_REF.finditer(text):
            name, anchor, rules, section = "docs/%s.md" % m.group(1), m.group(2), m.group(3), m.group(4)
            p = page(name)
            if p is None:
                problems.append("%s: %s does not exist" % (where(m), name))
                continue
            if anchor and anchor not in p.anchors:
                problems.append("%s: %s has no heading or id '#%s'" % (where(m), name, anchor))
            if rules:
                for n in rule_numbers(rules):
                    if n not in p.rules:
                        problems.append("%s: %s has no 'Rule %d' heading" % (where(m), name, n))
            if section and not p.has_section(section):
                problems.append("%s: %s has no section \"%s\"" % (where(m), name, section))
        for m in README_REF.finditer(text):
            anchor, section = m.group(1), m.group(2) or m.group(3)
            readme = page("README.md")
            if anchor and anchor not in readme.anchors:
                problems.append("%s: README.md has no heading or id '#%s'" % (where(m), anchor))
            if section and not readme.has_section(section):
                problems.append("%s: README.md has no section \"%s\"" % (where(m), section))
        for m in DESIGN_REF.finditer(text):
            if f == "CHANGELOG.md":
                continue
            problems.append("%s: cites %r: the design is docs/design.md" % (where(m), m.group(0)))
        if f.endswith(RULE_SUFFIXES) and design is not None:
            for m in BARE_RULE.finditer(text):
                for n in rule_numbers(m.group(1)):
                    if n not in design.rules:
                        problems.append("%s: '%s': docs/design.md has no 'Rule %d'" % (where(m), m.group(0), n))

    for name, p in list(pages.items()):
        if not name.endswith(".md"):
            continue
        base = os.path.dirname(name)
        for lineno, line, fenced in fenced_lines(p.text):
            if fenced:
                continue
            # Relative links between pages and to files.
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                if re.match(r"^[a-z]+:", target):
                    continue
                path, _, anchor = target.partition("#")
                full = os.path.normpath(os.path.join(base, path)) if path else name
                if not os.path.exists(os.path.join(ROOT, full)):
                    problems.append("%s:%d: link to %s: no such file" % (name, lineno, target))
                elif anchor and full.endswith(".md"):
                    q = page(full)
                    if anchor not in q.anchors:
                        problems.append("%s:%d: link to %s: %s has no '#%s'" % (name, lineno, target, full, anchor))
            # Repository paths the page names.
            for tok in re.findall(r"(?<![\w./$~-])((?:%s)/[\w./*{},-]*)" % "|".join(TOP_DIRS), line):
                tok = tok.rstrip(".,;:)")
                # Globs and placeholders (fuzz/corpus/TARGET) name no one file.
                if not tok or any(c in tok for c in "*{}") or re.search(r"/[A-Z][A-Z_]+(/|$)", tok):
                    continue
                cands = [tok] + [tok + s for s in (".h", ".cc", ".py", ".sh", ".md", ".bzl", ".yml")]
                if not any(os.path.exists(os.path.join(ROOT, c)) for c in cands):
                    problems.append("%s:%d: names %s, which does not exist" % (name, lineno, tok))


def zf_subcommands():
    text = open(os.path.join(ROOT, "zf"), encoding="utf-8").read()
    body = text[text.index("main() {"):]
    return set(re.findall(r"^\s+([a-z][\w-]*)\) cmd_", body, re.M))


def check_zf_commands(files, problems):
    subs = zf_subcommands()
    index = os.path.join(ROOT, "docs/index.md")
    table = {}
    if os.path.exists(index):
        for line in open(index, encoding="utf-8"):
            m = re.match(r"^\| `\./zf ([a-z][\w-]*)[^`]*` \|(.*)\|\s*$", line)
            if m:
                cells = [c.strip() for c in m.group(2).split("|")]
                table[m.group(1)] = cells[-1] if len(cells) >= 2 else ""
    for s in sorted(subs):
        if not table.get(s):
            problems.append("docs/index.md: the command table has no row with a 'tested by' entry for ./zf %s" % s)
    for f in doc_pages(files):
        for i, line in enumerate(open(os.path.join(ROOT, f), encoding="utf-8"), 1):
            for s in re.findall(r"\./zf ([a-z][\w-]*)", line):
                if s not in subs:
                    problems.append("%s:%d: ./zf %s is not a subcommand of ./zf" % (f, i, s))


# ---- examples ----

def examples(files, problems):
    """Returns (page, line, kind, lang, code) for every marked block."""
    found = []
    for f in doc_pages(files):
        lines = open(os.path.join(ROOT, f), encoding="utf-8").read().split("\n")
        i = 0
        while i < len(lines):
            m = re.match(r"^\s*```+\s*([\w+-]*)\s*$", lines[i])
            if not m:
                i += 1
                continue
            lang = m.group(1).lower()
            j = i + 1
            while j < len(lines) and not re.match(r"^\s*```+\s*$", lines[j]):
                j += 1
            code = "\n".join(lines[i + 1:j]) + "\n"
            if lang in EXAMPLE_LANGS:
                kind, k = None, i - 1
                back = 0
                while k >= 0 and back < 5:
                    mk = MARKER.search(lines[k])
                    if mk:
                        kind = mk.group(1)
                        break
                    if lines[k].strip():
                        back += 1
                    k -= 1
                if kind is None:
                    problems.append("%s:%d: a %s block without a <!-- zf-example: run|parse-only --> marker"
                                    % (f, i + 1, lang))
                else:
                    if kind == "parse-only" and not any(
                            l.lstrip().startswith("*Not run by the docs check") for l in lines[k:i]):
                        problems.append("%s:%d: a parse-only block must say why, visibly: a line starting "
                                        "'*Not run by the docs check' after its marker" % (f, i + 1))
                    found.append((f, i + 1, kind, EXAMPLE_LANGS[lang], code))
            elif lang == "" and code.strip() and COMMAND_START.match(code.strip().split("\n")[0]):
                problems.append("%s:%d: a block of commands without a language (```sh) and a marker" % (f, i + 1))
            i = j + 1
    return found


def start_daemon(tmp):
    binary = os.path.join(ROOT, "bazel-bin/server/zenflowd")
    if not os.access(binary, os.X_OK):
        raise RuntimeError("%s is missing: bazel build //server:zenflowd //python:_zenflow.so first" % binary)
    port_file = os.path.join(tmp, "port")
    log = open(os.path.join(tmp, "zenflowd.log"), "w")
    # Its admin socket in the check's directory; the examples find it the
    # same way (zfctl reads ZENFLOW_ADMIN_SOCKET).
    env = dict(os.environ, ZENFLOW_ADMIN_SOCKET=os.path.join(tmp, "admin.sock"))
    proc = subprocess.Popen([binary, "--listen=127.0.0.1:0", "--port_file=" + port_file],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    for _ in range(300):
        if os.path.exists(port_file) and os.path.getsize(port_file) > 0:
            return proc, "127.0.0.1:" + open(port_file).read().strip()
        if proc.poll() is not None:
            raise RuntimeError("zenflowd exited: " + open(os.path.join(tmp, "zenflowd.log")).read())
        time.sleep(0.1)
    proc.terminate()
    raise RuntimeError("zenflowd did not start serving")


def run_examples(found, problems, timeout):
    with tempfile.TemporaryDirectory(prefix="zf-docs-") as tmp:
        for f, line, kind, lang, code in found:
            if kind != "parse-only":
                continue
            path = os.path.join(tmp, "parse.py" if lang == "python" else "parse.sh")
            open(path, "w").write(code)
            cmd = ["/usr/bin/python3", "-m", "py_compile", path] if lang == "python" else ["bash", "-n", path]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                problems.append("%s:%d: does not parse: %s" % (f, line, (r.stderr or r.stdout).strip()[-400:]))
        runs = [e for e in found if e[2] == "run"]
        if not runs:
            return
        proc, target = start_daemon(tmp)
        env = dict(os.environ)
        # The examples' scratch (mktemp, tempfile) goes with this directory.
        env["TMPDIR"] = os.path.join(tmp, "tmp")
        os.mkdir(env["TMPDIR"])
        env["ZENFLOW_TARGET"] = target
        env["ZENFLOW_ADMIN_SOCKET"] = os.path.join(tmp, "admin.sock")
        env["ZENFLOWD"] = os.path.join(ROOT, "bazel-bin/server/zenflowd")
        env["PYTHONPATH"] = os.pathsep.join(
            [os.path.join(ROOT, "python"), os.path.join(ROOT, "bazel-bin/python")] +
            ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        try:
            for n, (f, line, kind, lang, code) in enumerate(runs):
                path = os.path.join(tmp, "example%d.%s" % (n, "py" if lang == "python" else "sh"))
                open(path, "w").write(code)
                cmd = ["/usr/bin/python3", path] if lang == "python" else ["bash", "-e", "-o", "pipefail", path]
                t0 = time.monotonic()
                try:
                    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
                    rc, out = r.returncode, (r.stdout + r.stderr)
                except subprocess.TimeoutExpired as e:
                    rc, out = "timeout", str(e)
                took = time.monotonic() - t0
                if rc != 0:
                    problems.append("%s:%d: the %s example failed (%s) after %.1f s:\n%s"
                                    % (f, line, lang, rc, took, out.strip()[-1500:]))
                else:
                    print("docs: ran %s:%d (%s, %.1f s)" % (f, line, lang, took))
        finally:
            proc.terminate()
            proc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--refs", action="store_true", help="check references only")
    ap.add_argument("--examples", action="store_true", help="check and run the examples only")
    ap.add_argument("--timeout", type=float, default=180, help="seconds one example may run")
    args = ap.parse_args()
    both = not args.refs and not args.examples
    files = repo_files()
    problems = []
    if args.refs or both:
        check_refs(files, problems)
        check_zf_commands(files, problems)
    if args.examples or both:
        found = examples(files, problems)
        try:
            run_examples(found, problems, args.timeout)
        except RuntimeError as e:
            problems.append(str(e))
    problems = list(dict.fromkeys(problems))
    for p in problems:
        print("docs: " + p)
    done = {(True, False): "every reference resolves", (False, True): "every example ran"}.get(
        (args.refs, args.examples), "every reference resolves and every example ran")
    print("docs: %s" % ("%d problem(s)" % len(problems) if problems else done))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
