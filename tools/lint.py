#!/usr/bin/env python3
"""./zf lint: the project's C++ checked by clang's thread-safety analysis.

gcc, the project's compiler, ignores the GUARDED_BY / EXCLUSIVE_LOCKS_REQUIRED
annotations (common/mutex.h). This script takes the real compile commands of
the gcc build from `bazel aquery`, keeps what decides how a file parses (its
include paths, macros, language standard and target flags), and runs each
project source through clang 14 with -fsyntax-only and
-Wthread-safety -Werror=thread-safety: no object files, so the gcc build's
outputs and cache stay as they are, and the pass takes a few minutes.

The build must have run first (./zf lint and ./zf test build before calling
this): the generated headers (protobuf, gRPC) are the build's outputs. A
compile whose object file is missing is reported as not built, and a file
clang cannot parse is an error like any thread-safety finding.

Usage: tools/lint.py [--jobs=N] [--clang=PATH] [-- BAZEL_OPTIONS...]
(BAZEL_OPTIONS: those of the build, e.g. --config=tsan, so that aquery
describes the build that ran.)
"""

import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import time

# The folders whose sources are the project's own (external/ and generated
# code under bazel-out/ are not checked; their headers are included with
# -isystem or are the build's, and clang does not warn in system headers).
PROJECT_DIRS = ("server/", "client/", "common/", "gpu_worker/", "tools/", "tests/", "fuzz/",
                "python/")
SOURCE_SUFFIXES = (".cc", ".cpp", ".cxx", ".c")

# Flags taking a separate value that decide how a file parses.
PATH_FLAGS = ("-I", "-iquote", "-isystem", "-idirafter", "-include", "-D", "-U")
# Single flags kept as they are: the language standard, target features
# (SIMD files are built with -mavx2 and the like) and threads.
KEEP_PATTERNS = (re.compile(r"^-std="), re.compile(r"^-m"), re.compile(r"^-pthread$"),
                 re.compile(r"^-fsanitize="), re.compile(r"^-fopenmp$"),
                 re.compile(r"^-f(no-)?(exceptions|rtti|char8_t|signed-char|unsigned-char)$"),
                 re.compile(r"^-fvisibility="))

CLANG_FLAGS = [
    "-fsyntax-only",
    # Only the analysis this pass is for: clang's other warnings are not
    # the gcc build's and would bury its findings.
    "-Wno-everything",
    "-Wthread-safety",
    "-Werror=thread-safety",
    "-fcolor-diagnostics" if sys.stdout.isatty() else "-fno-color-diagnostics",
]


def log(msg):
    print(f"lint: {msg}", file=sys.stderr, flush=True)


def bazel(args, cwd):
    # Bazel's progress and INFO lines would bury the findings; errors stay.
    quiet = ["--noshow_progress", "--ui_event_filters=-info"]
    return subprocess.run(["bazel", args[0]] + quiet + args[1:], cwd=cwd, check=True, text=True,
                          stdout=subprocess.PIPE).stdout


def compile_actions(root, bazel_options):
    """The CppCompile actions of //... as (label, arguments) pairs."""
    out = bazel(["aquery", "--include_artifacts=false", "--output=jsonproto"] + bazel_options +
                ['mnemonic("CppCompile", //...)'], root)
    data = json.loads(out) if out.strip() else {}
    labels = {t["id"]: t["label"] for t in data.get("targets", [])}
    return [(labels.get(a.get("targetId"), "?"), a.get("arguments", []))
            for a in data.get("actions", [])]


def source_and_output(args):
    src = out = None
    for i, a in enumerate(args[:-1]):
        if a == "-c":
            src = args[i + 1]
        elif a == "-o":
            out = args[i + 1]
    return src, out


def parse_flags(args):
    """The flags of a gcc command line that clang needs to parse the file."""
    kept = []
    i = 1  # args[0] is the compiler
    while i < len(args):
        a = args[i]
        joined = next((f for f in PATH_FLAGS if a.startswith(f) and a != f), None)
        if a in PATH_FLAGS and i + 1 < len(args):
            kept += [a, args[i + 1]]
            i += 2
            continue
        if joined is not None or any(p.match(a) for p in KEEP_PATTERNS):
            kept.append(a)
        elif a in ("-c", "-o", "-MF"):
            i += 1  # and its value
        i += 1
    return kept


def check(clang, root, execroot, src, flags):
    # Bazel plants in the execution root only the top-level folders its last
    # build needed (a `bazel build //server:zenflowd` leaves out tests/ and
    # fuzz/), so the source and the project's own headers are also looked up
    # in the workspace itself; generated headers stay under bazel-out/.
    cmd = [clang] + CLANG_FLAGS + flags + ["-iquote", root, os.path.join(root, src)]
    p = subprocess.run(cmd, cwd=execroot, text=True, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT)
    return src, p.returncode, p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=2, help="clang processes at a time")
    ap.add_argument("--clang", default="clang++-14")
    ap.add_argument("bazel_options", nargs="*", help="options of the build (after --)")
    o = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if subprocess.run(["sh", "-c", f"command -v {o.clang}"], stdout=subprocess.DEVNULL).returncode:
        log(f"{o.clang} not found (Debian package clang-14; ./zf lint installs it)")
        return 2

    execroot = bazel(["info"] + o.bazel_options + ["execution_root"], root).strip()
    started = time.monotonic()
    actions = compile_actions(root, o.bazel_options)

    # One check per source and distinct flag set: a file compiled into
    # several targets with the same flags (a test under two names, a fuzz
    # target and its regression test) is parsed once. Only compiles the
    # build ran count (their objects exist, so did their generated headers);
    # a source none of whose compiles ran is an error.
    by_source = {}
    for label, args in actions:
        src, out = source_and_output(args)
        if src is None or not src.startswith(PROJECT_DIRS) or not src.endswith(SOURCE_SUFFIXES):
            continue
        built = out is not None and os.path.exists(os.path.join(execroot, out))
        by_source.setdefault(src, []).append((built, label, tuple(parse_flags(args))))
    jobs, not_built = [], []
    for src in sorted(by_source):
        flag_sets = sorted({flags for built, _, flags in by_source[src] if built})
        if not flag_sets:
            not_built.append((src, by_source[src][0][1]))
        for flags in flag_sets:
            jobs.append((src, list(flags)))
    if not jobs and not not_built:
        log("aquery found no project sources to check")
        return 1
    for src, label in not_built:
        log(f"ERROR: {src} ({label}) is not built: run `bazel build //...` first")

    log(f"{len(jobs)} compiles of {len({s for s, _ in jobs})} files, {o.jobs} at a time")
    errors = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, o.jobs)) as pool:
        for src, rc, text in pool.map(lambda j: check(o.clang, root, execroot, j[0], j[1]), jobs):
            if rc != 0:
                errors.append((src, text))
                sys.stdout.write(text)
            elif text.strip():
                sys.stdout.write(text)  # notes and anything else clang said
            sys.stdout.flush()
    findings = sum(len(re.findall(r"\[-Werror,-Wthread-safety[^\]]*\]", t)) for _, t in errors)
    # Any other error means clang could not parse the file as the build does.
    parse_failures = {s for s, t in errors
                      if re.search(r"error: (?!.*\[-Werror,-Wthread-safety)", t) or
                      not re.search(r"-Wthread-safety", t)}
    unsafe = {s for s, t in errors if re.search(r"\[-Werror,-Wthread-safety", t)}
    files = len({s for s, _ in jobs})
    secs = time.monotonic() - started
    print(f"lint: {files} files checked ({len(jobs)} compiles) with {o.clang} "
          f"-fsyntax-only -Wthread-safety in {secs:.0f} s: {findings} thread-safety errors in "
          f"{len(unsafe)} files, {len(parse_failures)} files clang could not parse, "
          f"{len(not_built)} not built")
    for src, text in errors:
        kind = " and ".join(k for k, bad in (("thread-safety", src in unsafe),
                                              ("cannot parse", src in parse_failures)) if bad)
        print(f"lint: FAILED {src} ({kind})")
    return 1 if errors or not_built else 0


if __name__ == "__main__":
    sys.exit(main())
