#!/usr/bin/env python3
"""Checks rendered deploy/k8s manifests for what zenflowd needs of them.

    check_rendered.py [--rules RULES.yml] [--containerfile FILE]
                      [--json-dir DIR] RENDERED.yaml...

Each RENDERED.yaml is the output of `kubectl kustomize` for one overlay (its
file name, e.g. production.yaml, picks the overlay's own expectations). The
schema check is validate/validate.cjs; this script checks what a schema
cannot: that the pieces agree with each other and with zenflowd. The flags
zenflowd would read (the ConfigMap's flags file and the files it includes)
against the ports, probes, volume and memory limit; the selectors against
the labels; the security settings; TLS (the --tls_* flags name files a
Secret provides, not readable by others; the probes use --health_listen's
port, since the kubelet's gRPC probes cannot speak TLS); the ServiceMonitor
against the scrape job rules.yml expects; the PrometheusRule against
rules.yml; the uid against the Containerfile. An overlay (any name but
"base") brings its Namespace, and every namespaced object is in it. With
--checkpoint-json the pod's terminationGracePeriodSeconds must cover a
SIGTERM checkpoint of its memory limit (deploy/stop_timeout.py, the rule of
docs/operating.md#stop-timeouts). Secrets in the input (a rendering with
deploy/k8s/make-secrets.sh's secrets.yaml added) must hold every key the pod
projects. With --json-dir it also writes each input as a JSON array
of its objects (for validate.cjs). Exit status 1 on any problem.
"""

import argparse
import json
import pathlib
import re
import sys

import yaml

# deploy/stop_timeout.py, beside this script's directory (in the source tree
# and in Bazel's runfiles alike).
sys.path.insert(0, str(pathlib.Path(__file__).absolute().parent.parent))
import stop_timeout  # noqa: E402

FLAGS_DIR = "/etc/zenflowd"
FLAGS_FILE = f"{FLAGS_DIR}/zenflowd.flags"
STATE_DIR = "/var/lib/zenflowd"
BUDGET_SHARE = 0.75  # zenflowd's default budget: 3/4 of the cgroup's memory.max

_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "m": 1e-3}


def quantity(q):
    """A Kubernetes quantity ("4Gi", "500m", "2") as a number."""
    m = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(q))
    if not m or m.group(2) not in _UNITS:
        raise ValueError(f"unsupported quantity {q!r}")
    return float(m.group(1)) * _UNITS[m.group(2)]


def read_flags(data, problems):
    """The flags zenflowd reads from the ConfigMap's files (later wins)."""
    flags = {}

    def read(name, depth):
        if name not in data:
            problems.append(f"flags file {name} is not in the ConfigMap")
            return
        for line in data[name].splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, _, value = line.lstrip("-").partition("=")
            if key == "flagfile":
                if not value.startswith(FLAGS_DIR + "/") or depth > 4:
                    problems.append(f"{name}: --flagfile={value} is not a file of {FLAGS_DIR}")
                else:
                    read(value[len(FLAGS_DIR) + 1:], depth + 1)
            else:
                flags[key] = value

    read(pathlib.PurePath(FLAGS_FILE).name, 0)
    return flags


def port_of(hostport):
    return int(hostport.rsplit(":", 1)[1])


def config_maps_of(volume):
    """Names of the ConfigMaps a volume shows (configMap or projected)."""
    names = set()
    if "configMap" in volume:
        names.add(volume["configMap"].get("name"))
    for source in volume.get("projected", {}).get("sources", []):
        if "configMap" in source:
            names.add(source["configMap"].get("name"))
    return names


def secret_file(volume, rel):
    """(secret name, file mode) of the file `rel` in a volume when a Secret
    provides it (a secret volume, or a projected volume's secret source), or
    None. Without items every key of the Secret is a file: any `rel` counts."""
    if "secret" in volume:
        default = volume["secret"].get("defaultMode", 0o644)
        sources = [(volume["secret"].get("secretName"), volume["secret"])]
    else:
        default = volume.get("projected", {}).get("defaultMode", 0o644)
        sources = [(s["secret"].get("name"), s["secret"])
                   for s in volume.get("projected", {}).get("sources", []) if "secret" in s]
    for name, secret in sources:
        items = secret.get("items")
        if items is None and "/" not in rel:
            return name, default
        for item in items or []:
            if item.get("path") == rel:
                return name, item.get("mode", default)
    return None


def containerfile_uid(path):
    text = pathlib.Path(path).read_text()
    m = re.search(r"^USER\s+(\d+)(?::(\d+))?\s*$", text, re.M)
    return (int(m.group(1)), int(m.group(2) or m.group(1))) if m else None


# Kinds without a namespace among the rendered objects.
CLUSTER_KINDS = {"Namespace", "PriorityClass"}


def projected_secret_keys(volume):
    """{secret name: keys} a volume shows from Secrets."""
    found = {}
    if "secret" in volume:
        s = volume["secret"]
        found[s.get("secretName")] = {i["key"] for i in s.get("items", [])}
    for source in volume.get("projected", {}).get("sources", []):
        if "secret" in source:
            s = source["secret"]
            found.setdefault(s.get("name"), set()).update(i["key"] for i in s.get("items", []))
    return found


def check(name, objs, rules_groups, uid, problems, rate=None):
    def fail(msg):
        problems.append(f"{name}: {msg}")

    by_kind = {}
    for o in objs:
        by_kind.setdefault(o["kind"], []).append(o)
    for kind in ("ServiceAccount", "ConfigMap", "Service", "StatefulSet", "PodDisruptionBudget",
                 "NetworkPolicy", "ServiceMonitor", "PrometheusRule"):
        if len(by_kind.get(kind, [])) != 1:
            fail(f"expected one {kind}, found {len(by_kind.get(kind, []))}")
    if problems and any(p.startswith(f"{name}: expected one") for p in problems):
        return
    # An overlay creates its namespace and puts everything else in it.
    if name != "base":
        spaces = [o["metadata"]["name"] for o in by_kind.get("Namespace", [])]
        if len(spaces) != 1:
            fail(f"expected one Namespace, found {len(spaces)}")
        else:
            for o in objs:
                if o["kind"] not in CLUSTER_KINDS and o["metadata"].get("namespace") != spaces[0]:
                    fail(f"{o['kind']} {o['metadata']['name']} is in namespace "
                         f"{o['metadata'].get('namespace')}, not the overlay's {spaces[0]}")
    (sts,), (svc,), (cm,) = by_kind["StatefulSet"], by_kind["Service"], by_kind["ConfigMap"]
    (pdb,), (netpol,) = by_kind["PodDisruptionBudget"], by_kind["NetworkPolicy"]
    (smon,), (prule,), (sa,) = by_kind["ServiceMonitor"], by_kind["PrometheusRule"], \
        by_kind["ServiceAccount"]
    spec = sts["spec"]
    pod = spec["template"]["spec"]
    pod_labels = spec["template"]["metadata"].get("labels", {})

    def selects(selector, labels):
        return bool(selector) and all(labels.get(k) == v for k, v in selector.items())

    # Selectors: StatefulSet, Service, PDB and NetworkPolicy pick these pods;
    # the ServiceMonitor picks the Service.
    for what, sel in (("StatefulSet selector", spec["selector"].get("matchLabels")),
                      ("Service selector", svc["spec"].get("selector")),
                      ("PodDisruptionBudget selector", pdb["spec"]["selector"].get("matchLabels")),
                      ("NetworkPolicy podSelector", netpol["spec"]["podSelector"].get("matchLabels"))):
        if not selects(sel, pod_labels):
            fail(f"{what} {sel} does not select the pod labels {pod_labels}")
    if not selects(smon["spec"]["selector"].get("matchLabels"), svc["metadata"].get("labels", {})):
        fail("the ServiceMonitor's selector does not select the Service")
    if spec.get("serviceName") != svc["metadata"]["name"]:
        fail(f"serviceName {spec.get('serviceName')} is not the Service {svc['metadata']['name']}")
    if svc["spec"].get("clusterIP") != "None":
        fail("the Service is not headless (clusterIP: None)")
    if pod.get("serviceAccountName") != sa["metadata"]["name"] or \
            pod.get("automountServiceAccountToken") is not False:
        fail("the pod must use the zenflowd ServiceAccount without a mounted token")

    # The container, its flags and its ports.
    if len(pod["containers"]) != 1:
        fail("expected one container")
        return
    c = pod["containers"][0]
    if c.get("args") != [f"--flagfile={FLAGS_FILE}"]:
        fail(f"container args {c.get('args')} are not [--flagfile={FLAGS_FILE}]")
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
    flags_mount = mounts.get(FLAGS_DIR)
    if not flags_mount or cm["metadata"]["name"] not in config_maps_of(
            volumes.get(flags_mount["name"], {})):
        fail(f"{FLAGS_DIR} is not the ConfigMap {cm['metadata']['name']}")
    flags = read_flags(cm.get("data", {}), problems)
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    want = {"grpc": port_of(flags.get("listen", "127.0.0.1:50051")),
            "metrics": port_of(flags.get("metrics_listen", "127.0.0.1:9464"))}
    if flags.get("health_listen"):
        want["health"] = port_of(flags["health_listen"])
    else:
        fail("no --health_listen: the kubelet's gRPC probes cannot reach a TLS port")
    ucx_range = env.get("UCX_TCP_PORT_RANGE", "")
    if not re.fullmatch(r"(\d+)-\1", ucx_range):
        fail(f"UCX_TCP_PORT_RANGE={ucx_range!r} does not pin one port")
    else:
        want["ucx"] = int(ucx_range.split("-")[0])
    for pname, port in want.items():
        if ports.get(pname) != port:
            fail(f"containerPort {pname} is {ports.get(pname)}, the flags/env say {port}")
    for flag in ("listen", "metrics_listen", "health_listen"):
        if not flags.get(flag, "").startswith(("0.0.0.0:", "[::]:")):
            fail(f"--{flag}={flags.get(flag)} is not reachable from other pods")

    # TLS: gRPC is never plaintext here (the pods need --allow_insecure for
    # UCX and /metrics, which would also let gRPC go plaintext without
    # these). Each file comes from a Secret and is not readable by others.
    # The admin token likewise (docs/security.md).
    for flag in ("tls_cert", "tls_key", "tls_ca", "admin_token_file"):
        path = flags.get(flag, "")
        if not path:
            fail(f"no --{flag}: gRPC would not be TLS with client certificates"
                 if flag != "admin_token_file" else "no --admin_token_file: no admin token")
            continue
        mount = max((m for m in mounts if path.startswith(m.rstrip("/") + "/")),
                    key=len, default=None)
        found = mount and secret_file(volumes.get(mounts[mount]["name"], {}),
                                      path[len(mount.rstrip("/")) + 1:])
        if not found:
            fail(f"--{flag}={path} is not a file of a mounted Secret")
        elif found[1] & 0o007:
            fail(f"--{flag}={path} is readable by others (mode {found[1]:o})")
    tls = flags.get("ucx_tls", "sm,self").split(",")
    if flags.get("ucx", "true") != "false" and ("tcp" not in tls or "sm" in tls):
        fail(f"--ucx_tls={','.join(tls)}: pods share no memory; use tcp,self")
    svc_ports = {p["name"]: p for p in svc["spec"]["ports"]}
    for pname in ("grpc", "ucx", "metrics"):
        p = svc_ports.get(pname)
        if not p or p.get("targetPort") not in (pname, ports.get(pname)):
            fail(f"the Service has no port {pname} to the container's {pname}")

    # Probes: native gRPC on the health port (plaintext, health checks only).
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        if (c.get(probe) or {}).get("grpc", {}).get("port") != ports.get("health"):
            fail(f"{probe} is not a gRPC probe on the health port {ports.get('health')}")

    # State volume from the claim template at --state_dir.
    claims = {t["metadata"]["name"] for t in spec.get("volumeClaimTemplates", [])}
    state = mounts.get(STATE_DIR)
    if not state or state["name"] not in claims:
        fail(f"{STATE_DIR} is not mounted from a volumeClaimTemplate")
    if flags.get("state_dir") != STATE_DIR:
        fail(f"--state_dir={flags.get('state_dir')} is not {STATE_DIR}")

    # Resources: requests equal limits; the budget fits the memory limit.
    res = c.get("resources", {})
    for r in ("cpu", "memory"):
        if r not in res.get("limits", {}) or res.get("requests", {}).get(r) != res["limits"][r]:
            fail(f"resources: {r} needs a limit and a request equal to it")
    if "memory" in res.get("limits", {}):
        limit = quantity(res["limits"]["memory"])
        budget = int(flags.get("memory_budget_bytes", "0"))
        if budget > BUDGET_SHARE * limit:
            fail(f"--memory_budget_bytes={budget} is over {BUDGET_SHARE} of the memory limit")
    if "cpu" in res.get("limits", {}):
        threads = int(flags.get("update_threads", "2"))
        if threads > quantity(res["limits"]["cpu"]):
            fail(f"--update_threads={threads} is more than the CPU limit {res['limits']['cpu']}")

    # Stop timeout: the SIGTERM checkpoint of the memory limit fits the
    # grace period (Kubernetes' default is 30 s).
    if rate and "memory" in res.get("limits", {}):
        want = stop_timeout.rule_seconds(quantity(res["limits"]["memory"]), rate)
        have = pod.get("terminationGracePeriodSeconds", 30)
        print(f"check_rendered: {name}: limits.memory {res['limits']['memory']}: stop timeout "
              f"at least {want} s; terminationGracePeriodSeconds {have}")
        if have < want:
            fail(f"terminationGracePeriodSeconds {have} is shorter than the {want} s a SIGTERM "
                 f"checkpoint of limits.memory {res['limits']['memory']} may take "
                 f"(docs/operating.md#stop-timeouts)")

    # Secrets rendered with the manifests hold every key the pod projects.
    secrets = {o["metadata"]["name"]: o for o in by_kind.get("Secret", [])}
    if secrets:
        for volume in volumes.values():
            for sname, keys in projected_secret_keys(volume).items():
                data = set(secrets.get(sname, {}).get("data", {}))
                if sname not in secrets:
                    fail(f"the pod projects Secret {sname}, which is not rendered")
                elif not keys <= data:
                    fail(f"Secret {sname} lacks the keys {sorted(keys - data)} the pod projects")

    # Security.
    psc, csc = pod.get("securityContext", {}), c.get("securityContext", {})
    merged = {**psc, **csc}
    expect = {"runAsNonRoot": True, "readOnlyRootFilesystem": True,
              "allowPrivilegeEscalation": False}
    for key, value in expect.items():
        if merged.get(key) is not value:
            fail(f"securityContext.{key} is not {value}")
    if merged.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        fail("seccompProfile is not RuntimeDefault")
    if csc.get("capabilities", {}).get("drop") != ["ALL"]:
        fail("capabilities do not drop ALL")
    if uid and (merged.get("runAsUser"), merged.get("runAsGroup")) != uid:
        fail(f"runAsUser/runAsGroup {merged.get('runAsUser')}/{merged.get('runAsGroup')} are not "
             f"the Containerfile's USER {uid[0]}:{uid[1]}")
    if uid and psc.get("fsGroup") != uid[1]:
        fail(f"fsGroup {psc.get('fsGroup')} is not the Containerfile's group {uid[1]}")

    # NetworkPolicy: gRPC and UCX from pods of the namespace, metrics from a
    # namespace.
    allowed = {}
    for rule in netpol["spec"].get("ingress", []):
        for peer in rule.get("from", []):
            kind = "pods" if set(peer) == {"podSelector"} else \
                "namespace" if set(peer) == {"namespaceSelector"} else "other"
            for p in rule.get("ports", []):
                allowed.setdefault(p["port"], set()).add(kind)
    if "Ingress" not in netpol["spec"].get("policyTypes", []):
        fail("the NetworkPolicy does not police ingress")
    for pname, kind in (("grpc", "pods"), ("ucx", "pods"), ("metrics", "namespace")):
        if allowed.get(pname, set()) != {kind} and allowed.get(ports.get(pname), set()) != {kind}:
            fail(f"the NetworkPolicy lets {sorted(allowed.get(pname, []))} reach {pname}; "
                 f"want {kind} only")

    # ServiceMonitor: the scrape job rules.yml expects.
    endpoints = smon["spec"].get("endpoints", [])
    if not endpoints or any(e.get("port") not in svc_ports or not e.get("honorLabels")
                            for e in endpoints):
        fail("every ServiceMonitor endpoint must name a Service port and set honorLabels")
    elif any(svc_ports[e["port"]].get("targetPort") not in ("metrics", ports.get("metrics"))
             for e in endpoints):
        fail("the ServiceMonitor scrapes another port than metrics")
    job = svc["metadata"].get("labels", {}).get(smon["spec"].get("jobLabel"),
                                                  svc["metadata"]["name"])
    if job != "zenflowd":
        fail(f"the scrape job would be {job!r}; the rules expect 'zenflowd'")

    # PrometheusRule equals rules.yml.
    if rules_groups is not None and prule["spec"].get("groups") != rules_groups:
        fail("the PrometheusRule's groups differ from rules.yml; run deploy/k8s/sync_rules.py")

    # Each overlay's own shape.
    replicas = spec.get("replicas", 1)
    if name == "single-node" and replicas != 1:
        fail(f"replicas {replicas}, want 1")
    if name == "production":
        if replicas < 2:
            fail(f"replicas {replicas}, want several shards")
        anti = pod.get("affinity", {}).get("podAntiAffinity", {}) \
            .get("requiredDuringSchedulingIgnoredDuringExecution", [])
        if not any(t.get("topologyKey") == "kubernetes.io/hostname" and
                   selects(t.get("labelSelector", {}).get("matchLabels"), pod_labels)
                   for t in anti):
            fail("no required anti-affinity keeping shards on separate nodes")
        if not any(selects(t.get("labelSelector", {}).get("matchLabels"), pod_labels)
                   for t in pod.get("topologySpreadConstraints", [])):
            fail("no topology spread constraint over the shards")
        classes = {o["metadata"]["name"] for o in by_kind.get("PriorityClass", [])}
        if pod.get("priorityClassName") not in classes:
            fail(f"priorityClassName {pod.get('priorityClassName')} is not rendered with it")


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("rendered", nargs="+", type=pathlib.Path)
    p.add_argument("--rules", type=pathlib.Path, help="deploy/prometheus/rules.yml")
    p.add_argument("--containerfile", type=pathlib.Path, help="deploy/container/Containerfile")
    p.add_argument("--json-dir", type=pathlib.Path)
    p.add_argument("--checkpoint-json", type=pathlib.Path,
                   help="bench-results/checkpoint.json: check the stop timeout")
    args = p.parse_args(argv)
    rate = stop_timeout.write_rate(args.checkpoint_json) if args.checkpoint_json else None
    rules_groups = None
    if args.rules and args.rules.exists():
        rules_groups = yaml.safe_load(args.rules.read_text())["groups"]
    elif args.rules:
        print(f"check_rendered: NOTICE: {args.rules} is absent; PrometheusRule not compared",
              file=sys.stderr)
    uid = containerfile_uid(args.containerfile) if args.containerfile else None
    if args.containerfile and uid is None:
        print(f"check_rendered: {args.containerfile} has no numeric USER", file=sys.stderr)
        return 1
    problems = []
    for path in args.rendered:
        objs = [o for o in yaml.safe_load_all(path.read_text()) if o]
        check(path.stem, objs, rules_groups, uid, problems, rate)
        if args.json_dir:
            args.json_dir.mkdir(parents=True, exist_ok=True)
            (args.json_dir / f"{path.stem}.json").write_text(json.dumps(objs))
        print(f"check_rendered: {path.stem}: {len(objs)} objects")
    for problem in problems:
        print(f"FAIL {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
