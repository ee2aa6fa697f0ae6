#!/usr/bin/env bash
# The fidelity bench's CPU-bound section end to end, briefly: the command
# docs/benchmarks.md shows (tools/bench_fidelity.sh --cpu_bound_only --quick)
# with a few steps per workload, one seed and 8-step pretrainings (cached in
# the test's own directory), against the real zenflowd and zf_train. Checks
# the keys of fidelity.json's "cpu_bound" (docs/benchmarks.md "Fidelity"),
# that every measured ratio is finite and positive, that a setting the build
# cannot run says why, and that the file's other keys are kept. No timing is
# checked.
set -euo pipefail
# shellcheck source=tests/testing/fidelity_bench_env.sh
source "$TEST_SRCDIR/$TEST_WORKSPACE/tests/testing/fidelity_bench_env.sh"
out="$TEST_TMPDIR/fidelity.json"
# A grid's result from before: the section is merged beside it.
echo '{"benchmark": "fidelity", "default": {"ratio": 1.0025}}' > "$out"

"$R/tools/bench_fidelity.sh" --cpu_bound_only --quick --seeds=1 --steps=16 \
  --cpu_steps=16,8,32 --pretrain_steps=8 --out="$out"

/usr/bin/python3 - "$out" <<'EOF'
import json, math, sys

doc = json.load(open(sys.argv[1]))
problems = []
if doc.get("default", {}).get("ratio") != 1.0025:
    problems.append("the file's other keys were not kept: %r" % doc.get("default"))
cb = doc.get("cpu_bound")
if not isinstance(cb, dict):
    sys.exit("no cpu_bound section in %s" % sys.argv[1])

def finite(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

settings = ["default", "fixed_S2", "fixed_S4", "fixed_S8", "fixed_S4_rules_off"]
for w in ("lm", "finetune", "mlp"):
    e = cb.get("workloads", {}).get(w)
    if e is None:
        problems.append("cpu_bound.workloads.%s is missing" % w)
        continue
    if not (finite(e.get("emulate_round_ms")) and e["emulate_round_ms"] > 0):
        problems.append("%s: emulate_round_ms %r" % (w, e.get("emulate_round_ms")))
    if not (finite(e.get("measured_step_ms")) and e["measured_step_ms"] > 0):
        problems.append("%s: measured_step_ms %r" % (w, e.get("measured_step_ms")))
    if not all(finite(m) and m > 0 for m in e.get("reference", {}).get("metric", [None])):
        problems.append("%s: reference metric %r" % (w, e.get("reference")))
    for st in settings:
        r = e.get(st)
        if not isinstance(r, dict):
            problems.append("cpu_bound.workloads.%s.%s is missing" % (w, st))
            continue
        for key in ("ratio", "ratio_spread", "S_mean", "stall_fraction", "divergence"):
            if key not in r:
                problems.append("%s.%s has no %s" % (w, st, key))
        if "skipped" in r:
            # Only the rules-off setting may be skipped (a build without rules 12-13).
            if st != "fixed_S4_rules_off" or not r["skipped"]:
                problems.append("%s.%s skipped: %r" % (w, st, r["skipped"]))
            continue
        if not (finite(r.get("ratio")) and r["ratio"] > 0 and finite(r.get("ratio_spread"))):
            problems.append("%s.%s: ratio %r spread %r" % (w, st, r.get("ratio"), r.get("ratio_spread")))
        if not (finite(r.get("S_mean")) and r["S_mean"] >= 1):
            problems.append("%s.%s: S_mean %r" % (w, st, r.get("S_mean")))
        if st.startswith("fixed_S") and r.get("S_mean") != float(st[7]):
            problems.append("%s.%s: S_mean %r, not the fixed S" % (w, st, r.get("S_mean")))
        if not (finite(r.get("stall_fraction")) and 0 <= r["stall_fraction"] <= 1):
            problems.append("%s.%s: stall_fraction %r" % (w, st, r.get("stall_fraction")))
        if r.get("divergence") is not None and not finite(r["divergence"]):
            problems.append("%s.%s: divergence %r" % (w, st, r["divergence"]))
worst = cb.get("default_worst_ratio")
want = max(cb["workloads"][w]["default"]["ratio"] for w in ("lm", "finetune")
           if w in cb.get("workloads", {}))
if worst != want:
    problems.append("default_worst_ratio %r, not the worst default ratio of lm and finetune %r"
                    % (worst, want))
if problems:
    sys.exit("fidelity.json's cpu_bound section:\n  " + "\n  ".join(problems))
print("cpu_bound section: ok (%d trainings, default_worst_ratio %s)" % (cb["trainings"], worst))
EOF
