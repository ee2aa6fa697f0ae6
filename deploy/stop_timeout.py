#!/usr/bin/env python3
"""The stop timeout rule of zenflowd's deployments (docs/operating.md#stop-timeouts).

On SIGTERM zenflowd stops serving and writes a checkpoint of every job
before it exits. Whatever stops it (systemd's TimeoutStopSec=, the pod's
terminationGracePeriodSeconds) must wait that long, or the daemon is killed
mid-write and the jobs restart from an older checkpoint. The jobs' state
is at most the memory zenflowd may use, so:

    stop timeout >= memory limit / checkpoint write rate x MARGIN + DRAIN_S

with the write rate measured by `./zf bench checkpoint`
(bench-results/checkpoint.json, write_bytes_per_s). MARGIN covers the
snapshot copy before the write and a state disk slower than the one
measured; DRAIN_S the calls that end first (gRPC's 2 s shutdown, the
health listener's 2 s) and the process's exit.

    stop_timeout.py --checkpoint_json FILE --limit 128Gi
        prints the rule's seconds for that memory limit
    stop_timeout.py --checkpoint_json FILE --systemd_unit zenflowd.service
        checks the unit's TimeoutStopSec= against its MemoryMax=

deploy/k8s/check_rendered.py applies the same rule to the pod's
terminationGracePeriodSeconds and its container's memory limit. Exit
status 1 when a configured timeout is shorter than the rule.
"""

import argparse
import json
import math
import pathlib
import re
import sys

MARGIN = 2.0
DRAIN_S = 10.0

_K8S_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
              "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
# systemd's size suffixes are powers of 1024 (systemd.resource-control(5)).
_SYSTEMD_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def write_rate(checkpoint_json):
    """The measured checkpoint write rate, bytes per second."""
    rate = json.loads(pathlib.Path(checkpoint_json).read_text())["write_bytes_per_s"]
    if not rate > 0:
        raise ValueError(f"{checkpoint_json}: write_bytes_per_s is {rate}")
    return float(rate)


def rule_seconds(limit_bytes, rate):
    """The least stop timeout for a memory limit, whole seconds."""
    return math.ceil(limit_bytes / rate * MARGIN + DRAIN_S)


def k8s_bytes(q):
    m = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(q))
    if not m or m.group(2) not in _K8S_UNITS:
        raise ValueError(f"unsupported memory quantity {q!r}")
    return float(m.group(1)) * _K8S_UNITS[m.group(2)]


def systemd_bytes(v):
    m = re.fullmatch(r"([0-9.]+)([KMGT]?)", v.strip())
    if not m:
        raise ValueError(f"unsupported size {v!r} (want bytes or K, M, G, T)")
    return float(m.group(1)) * _SYSTEMD_UNITS[m.group(2)]


def systemd_seconds(v):
    """A systemd time span in s, min and h (e.g. "150s", "2min 30s", "90")."""
    units = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}
    parts = re.findall(r"\s*([0-9.]+)\s*([a-z]*)", v)
    if not parts or "".join(n + u for n, u in parts) != re.sub(r"\s", "", v) or \
            any(u not in units for _, u in parts):
        raise ValueError(f"unsupported time span {v!r}")
    return sum(float(n) * units[u] for n, u in parts)


def unit_settings(text):
    """The [Service] settings of a unit file (the last of each wins)."""
    settings, section = {}, None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith(("#", ";")):
            key, _, value = line.partition("=")
            settings[key.strip()] = value.strip()
    return settings


def check_systemd_unit(path, rate):
    """Problems of a unit's stop timeout against its memory limit."""
    s = unit_settings(pathlib.Path(path).read_text())
    if "MemoryMax" not in s:
        return [f"{path}: no MemoryMax=, so no stop timeout can be derived"]
    if "TimeoutStopSec" not in s:
        return [f"{path}: no TimeoutStopSec= (systemd's default is 90 s)"]
    limit = systemd_bytes(s["MemoryMax"])
    have = math.inf if s["TimeoutStopSec"] == "infinity" else systemd_seconds(s["TimeoutStopSec"])
    want = rule_seconds(limit, rate)
    print(f"stop_timeout: {path}: MemoryMax={s['MemoryMax']} at {rate / 1e9:.2f} GB/s x {MARGIN:g}"
          f" + {DRAIN_S:g} s: at least {want} s; TimeoutStopSec={s['TimeoutStopSec']}")
    if have < want:
        return [f"{path}: TimeoutStopSec={s['TimeoutStopSec']} is shorter than the {want} s a "
                f"SIGTERM checkpoint of MemoryMax={s['MemoryMax']} may take (docs/operating.md#stop-timeouts)"]
    return []


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint_json", required=True, type=pathlib.Path)
    p.add_argument("--limit", help="a memory limit (Kubernetes quantity, e.g. 128Gi)")
    p.add_argument("--systemd_unit", type=pathlib.Path)
    args = p.parse_args(argv)
    rate = write_rate(args.checkpoint_json)
    if args.limit:
        print(rule_seconds(k8s_bytes(args.limit), rate))
    problems = check_systemd_unit(args.systemd_unit, rate) if args.systemd_unit else []
    for problem in problems:
        print(f"FAIL {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
