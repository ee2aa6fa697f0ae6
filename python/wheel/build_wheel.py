#!/usr/bin/env python3
"""Builds the zenflow wheel for one or more CPython interpreters.

    build_wheel.py [--python=PATH]... [--out=DIR]

Runs under Debian's /usr/bin/python3 (tomllib, and python3-wheel's
`wheel pack`, which writes RECORD and names the file from the tags). For each
interpreter (default: this one) it asks that interpreter for its version and
extension suffix, builds //python:_zenflow.so against its headers with
`bazel build --define=zf_python=3.X` (bazel/pythons.bzl), and packs
python/zenflow/*.py plus the stripped extension as
zenflow-VERSION-cp3X-cp3X-linux_x86_64.whl into DIR (default dist/).

The version is the daemon's (server/version.h, what `zenflowd --version` and
GetStats report); the metadata is pyproject.toml's [project] table. The
extension links Debian 12's shared libraries (gRPC, protobuf, Abseil, UCX), so
the wheel is for Debian 12 hosts with those installed: its platform tag is
linux_x86_64, not manylinux. Prints the path of each wheel it wrote, one a
line, on stdout; everything else goes to stderr.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The oldest CPython the package supports (pyproject.toml's requires-python);
# Debian 12's pybind11 (2.10) itself needs 3.6.
MIN_VERSION = (3, 8)


def log(*args):
    print("build_wheel:", *args, file=sys.stderr, flush=True)


def version():
    """The release version: server/version.h's kZenflowVersion, the one place it is written."""
    text = open(os.path.join(ROOT, "server", "version.h")).read()
    m = re.search(r'kZenflowVersion\[\]\s*=\s*"([^"]+)"', text)
    if not m:
        raise SystemExit("build_wheel: no kZenflowVersion in server/version.h")
    return m.group(1)


def interpreter(python):
    """(major, minor), EXT_SUFFIX and implementation of the interpreter at `python`."""
    probe = ("import json, sys, sysconfig; print(json.dumps([sys.implementation.name, "
             "list(sys.version_info[:2]), sysconfig.get_config_var('EXT_SUFFIX'), "
             "hasattr(sys, 'gettotalrefcount')]))")
    out = subprocess.run([python, "-c", probe], check=True, capture_output=True, text=True).stdout
    impl, ver, suffix, debug = json.loads(out)
    return impl, tuple(ver), suffix, debug


def metadata(ver):
    """The METADATA file (core metadata 2.1) from pyproject.toml's [project]."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    lines = ["Metadata-Version: 2.1", f"Name: {project['name']}", f"Version: {ver}",
             f"Summary: {project['description']}"]
    for url_name, url in project.get("urls", {}).items():
        lines.append(f"Project-URL: {url_name}, {url}")
    if "license" in project:
        lines.append(f"License: {project['license']['text']}")
    lines.append(f"Requires-Python: {project['requires-python']}")
    for c in project.get("classifiers", []):
        lines.append(f"Classifier: {c}")
    for dep in project.get("dependencies", []):
        lines.append(f"Requires-Dist: {dep}")
    for extra, deps in project.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        for dep in deps:
            lines.append(f'Requires-Dist: {dep}; extra == "{extra}"')
    return "\n".join(lines) + "\n"


# The extension runs the CPU backend only (the binding refuses CUDA tensors),
# so the wheel is built as on a machine without the CUDA toolkit
# (bazel/cuda.bzl finds no nvcc under this CUDA_HOME): it then links no
# libcudart, which a Debian 12 host without CUDA lacks.
NO_CUDA = "--repo_env=CUDA_HOME=/nonexistent/zenflow-wheel-without-cuda"


def build_extension(major_minor):
    """Builds //python:_zenflow.so for CPython major.minor; returns its path in bazel-bin."""
    define = f"--define=zf_python={major_minor[0]}.{major_minor[1]}"
    log(f"bazel build {define} {NO_CUDA} //python:_zenflow.so")
    subprocess.run(["bazel", "build", define, NO_CUDA, "//python:_zenflow.so"], cwd=ROOT,
                   check=True, stdout=sys.stderr)
    return os.path.join(ROOT, "bazel-bin", "python", "_zenflow.so")


def build_one(python, out_dir, ver, built):
    """Builds python's wheel unless one of its tag was built already (`built`: tag -> python)."""
    impl, major_minor, suffix, debug = interpreter(python)
    name = f"{python} (CPython {major_minor[0]}.{major_minor[1]})"
    if impl != "cpython" or debug:
        log(f"skipping {python}: {impl}{' debug build' if debug else ''}, not a release CPython")
        return None
    if major_minor < MIN_VERSION:
        log(f"skipping {name}: zenflow needs Python {MIN_VERSION[0]}.{MIN_VERSION[1]} or newer")
        return None
    tag = f"cp{major_minor[0]}{major_minor[1]}"
    if tag in built:
        log(f"skipping {name}: the {tag} wheel built for {built[tag]} serves it too (same ABI)")
        return None
    built[tag] = python
    so = build_extension(major_minor)
    with tempfile.TemporaryDirectory(prefix="zf-wheel-") as tmp:
        tree = os.path.join(tmp, "tree")
        shutil.copytree(os.path.join(ROOT, "python", "zenflow"), os.path.join(tree, "zenflow"),
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        ext = os.path.join(tree, "_zenflow" + suffix)
        shutil.copyfile(so, ext)
        os.chmod(ext, 0o755)
        # Debug sections stay in the build; the wheel carries the code.
        subprocess.run(["strip", "--strip-unneeded", ext], check=True)
        info = os.path.join(tree, f"zenflow-{ver}.dist-info")
        os.makedirs(info)
        with open(os.path.join(info, "METADATA"), "w") as f:
            f.write(metadata(ver))
        with open(os.path.join(info, "WHEEL"), "w") as f:
            f.write("Wheel-Version: 1.0\nGenerator: zenflow build_wheel.py\n"
                    f"Root-Is-Purelib: false\nTag: {tag}-{tag}-linux_x86_64\n")
        with open(os.path.join(info, "top_level.txt"), "w") as f:
            f.write("_zenflow\nzenflow\n")
        os.makedirs(out_dir, exist_ok=True)
        # python3-wheel's `wheel pack` hashes every file into RECORD and names
        # the wheel from the WHEEL file's tag.
        packed = subprocess.run([sys.executable, "-m", "wheel", "pack", "-d", out_dir, tree],
                                capture_output=True, text=True)
        if packed.returncode != 0:
            raise SystemExit(f"build_wheel: wheel pack failed: {packed.stderr.strip()}")
        packed = packed.stdout
    path = os.path.join(out_dir, f"zenflow-{ver}-{tag}-{tag}-linux_x86_64.whl")
    if not os.path.exists(path):
        raise SystemExit(f"build_wheel: wheel pack did not write {path}: {packed}")
    log(f"{name}: {os.path.relpath(path)}")
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", action="append", default=[],
                    help="an interpreter to build for (repeatable; default: this one)")
    ap.add_argument("--out", default=os.path.join(ROOT, "dist"), help="where wheels go")
    args = ap.parse_args()
    ver = version()
    wrote, built = [], {}
    pythons = args.python or [sys.executable]
    for i, python in enumerate(pythons):
        try:
            path = build_one(python, os.path.abspath(args.out), ver, built)
        except subprocess.CalledProcessError as e:
            # The first interpreter's wheel is the one asked for; another
            # that cannot be built for (e.g. headers pybind11 2.10 does not
            # know) is reported and skipped.
            if i == 0:
                raise SystemExit(f"build_wheel: building for {python} failed: {e}")
            log(f"skipping {python}: its build failed ({e}); the output above says why")
            continue
        if path:
            wrote.append(path)
            print(path, flush=True)
    if any(p != sys.executable for p in pythons) or built:
        # bazel-bin/python/_zenflow.so is Debian's python3's again (./zf python,
        # the docs check), from Bazel's cache.
        subprocess.run(["bazel", "build", "//python:_zenflow.so"], cwd=ROOT, check=True,
                       stdout=sys.stderr, stderr=subprocess.DEVNULL)
    return 0 if wrote else 1


if __name__ == "__main__":
    sys.exit(main())
