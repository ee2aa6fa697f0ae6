#!/usr/bin/env bash
# The fidelity bench's grid end to end, briefly: tools/bench_fidelity.sh
# --quick (k 0.1; S 1, 4 and auto; the four apply delays) with 16 steps, one
# seed and 8-step pretrainings, then its CPU-bound section at a few steps,
# against the real zenflowd and zf_train. Checks the grid's rows: every
# setting's ratio finite and positive, the 8-bit rows (the default also at
# draw seeds 1-3: zenflowds at --adam8_draw_seed) and the perturbation
# control (the default in fp32 against a zenflowd at --simd=scalar) with
# ratio_vs_fp32 per seed, summary.perturbation_floor the control's largest
# deviation, summary.adam8_default_vs_fp32_over_draws, and the default. No
# timing is checked.
set -euo pipefail
# shellcheck source=tests/testing/fidelity_bench_env.sh
source "$TEST_SRCDIR/$TEST_WORKSPACE/tests/testing/fidelity_bench_env.sh"
out="$TEST_TMPDIR/fidelity.json"

"$R/tools/bench_fidelity.sh" --quick --seeds=1 --steps=16 --cpu_steps=16,8,32 \
  --pretrain_steps=8 --out="$out"

/usr/bin/python3 - "$out" <<'PY'
import json, math, sys

doc = json.load(open(sys.argv[1]))
problems = []

def finite(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

if doc.get("auto_available") is not True:
    sys.exit("update_interval auto was not available: %r" % doc.get("auto_available"))
runs = doc.get("runs", [])
grid = [r for r in runs if "optimizer_state" not in r and "control" not in r
        and not r.get("skipped") and not r.get("same_as")]
if not grid:
    problems.append("no grid rows")
for r in grid:
    if not (finite(r.get("ratio")) and r["ratio"] > 0):
        problems.append("k %r S %r %r: ratio %r" % (r.get("k"), r.get("S"), r.get("delay"), r.get("ratio")))
def vs_fp32(rows, what):
    if len(rows) != 1:
        problems.append("%d %s rows" % (len(rows), what))
        return None
    r = rows[0]
    vs = r.get("ratio_vs_fp32")
    if not (isinstance(vs, list) and len(vs) == 1 and all(finite(x) and x > 0 for x in vs)):
        problems.append("%s: ratio_vs_fp32 %r" % (what, vs))
        return None
    if r.get("ratio_vs_fp32_max") != round(max(abs(x - 1) for x in vs), 6):
        problems.append("%s: ratio_vs_fp32_max %r for %r" % (what, r.get("ratio_vs_fp32_max"), vs))
    return r
for S in ("auto", 4):
    vs_fp32([r for r in runs if r.get("optimizer_state") == "8bit" and r.get("S") == S
             and "draw_seed" not in r], "8-bit S %s" % S)
draws = [r for r in runs if "draw_seed" in r]
if sorted(r["draw_seed"] for r in draws) != [1, 2, 3]:
    problems.append("draw seeds %r, not 1, 2, 3" % [r.get("draw_seed") for r in draws])
for r in draws:
    vs_fp32([r], "8-bit S auto draw seed %r" % r["draw_seed"])
over = doc.get("summary", {}).get("adam8_default_vs_fp32_over_draws") or {}
if over.get("draw_seeds") != [0, 1, 2, 3] or len(over.get("min", [])) != 1 or \
        not over["min"][0] <= over["max"][0]:
    problems.append("summary.adam8_default_vs_fp32_over_draws %r" % over)
control = vs_fp32([r for r in runs if r.get("control") == "simd_scalar"], "simd_scalar control")
floor = doc.get("summary", {}).get("perturbation_floor")
if control is not None and floor != control["ratio_vs_fp32_max"]:
    problems.append("summary.perturbation_floor %r, the control's deviation %r"
                    % (floor, control["ratio_vs_fp32_max"]))
d = doc.get("default") or {}
if not (finite(d.get("ratio")) and d.get("S") == "auto"):
    problems.append("default %r" % d)
if "cpu_bound" not in doc:
    problems.append("no cpu_bound section")
if problems:
    sys.exit("fidelity.json:\n  " + "\n  ".join(problems))
print("ok: %d grid rows, 8-bit rows, the simd_scalar control (floor %r), the default" % (len(grid), floor))
PY
