"""The PEP 517 build backend of pyproject.toml: `pip install .` from a checkout.

zenflow's extension module is built by Bazel (//python:_zenflow.so), so the
backend hands the work to python/wheel/build_wheel.py, which runs under
Debian's /usr/bin/python3 (it needs tomllib and python3-wheel, which other
interpreters may lack) and builds for the interpreter running pip. It needs
no package from an index: pip installs offline. There is no sdist: the
extension builds only inside this repository's Bazel workspace.

Written for every Python the package supports (3.8 and newer).
"""

import os
import subprocess
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_BUILDER_PYTHON = os.environ.get("ZF_WHEEL_BUILDER_PYTHON", "/usr/bin/python3")


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    # pip's build isolation points PYTHONPATH at an environment that hides
    # the system's site-packages (python3-wheel among them); the builder is
    # Debian's python3 with its own.
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE", "PYTHONSAFEPATH")}
    out = subprocess.run(
        [_BUILDER_PYTHON, os.path.join(_HERE, "build_wheel.py"), "--python", sys.executable,
         "--out", os.path.abspath(wheel_directory)],
        check=True, stdout=subprocess.PIPE, universal_newlines=True, env=env).stdout
    paths = [line for line in out.splitlines() if line.strip()]
    if not paths:
        raise RuntimeError("build_wheel.py built no wheel for " + sys.executable)
    return os.path.basename(paths[-1])


def build_sdist(sdist_directory, config_settings=None):
    raise RuntimeError("zenflow has no sdist: its extension builds with Bazel inside the "
                       "repository; run `./zf wheel` there (or `pip install .` from it)")
