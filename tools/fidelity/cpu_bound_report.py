"""The CPU-bound section's JSON (fidelity.json's "cpu_bound") and its table.

Used by tools/fidelity/cpu_bound.py. Keys (an interface, docs/benchmarks.md
"Fidelity"): cpu_bound.workloads.<name>.emulate_round_ms, and per setting
(default, fixed_S2, fixed_S4, fixed_S8, fixed_S4_rules_off) an object with
ratio, ratio_spread, S_mean, stall_fraction, divergence and the per-seed
values; cpu_bound.default_worst_ratio is the worst default ratio over lm and
finetune.
"""

import json
import math
import os

METRIC = {"lm": "val_loss", "finetune": "val_loss", "mlp": "val_mse"}
REFERENCE = {
    "lm": "zf_train --mode=local (AdamW, one rank, the same start and batches)",
    "finetune": "torch.optim.AdamW (the same start and batches)",
    "mlp": "torch.optim.AdamW (the same initialization and batches)",
}
WORST_OVER = ("lm", "finetune")


def r6(x):
    return None if x is None else round(x, 6)


def mean(xs):
    return sum(xs) / len(xs)


def spread(xs):
    """The sample standard deviation; 0 for one value."""
    if len(xs) < 2:
        return 0.0
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def mean_or_none(xs):
    """The mean, or None when any value is missing (a build without the key)."""
    return None if not xs or any(x is None for x in xs) else mean(xs)


def stall_fraction(s):
    step = s.get("mean_step_ms") or 0.0
    return s.get("stall_ms_per_step", 0.0) / step if step > 0 else 0.0


def setting_entry(refs, sums):
    """One setting of one workload over the seeds (lists in seed order)."""
    skipped = [s["skipped"] for s in sums if "skipped" in s]
    if skipped:
        return {"ratio": None, "ratio_spread": None, "S_mean": None, "stall_fraction": None,
                "divergence": None, "skipped": skipped[0]}
    ratios = [s["metric"] / r["metric"] for s, r in zip(sums, refs)]
    fractions = [stall_fraction(s) for s in sums]
    s_means = [s.get("s_mean") for s in sums]
    divergences = [s.get("divergence") for s in sums]
    return {
        "ratio": r6(mean(ratios)),
        "ratio_spread": r6(spread(ratios)),
        "S_mean": r6(mean_or_none(s_means)),
        "stall_fraction": r6(mean(fractions)),
        "divergence": r6(mean_or_none(divergences)),
        "ratios": [r6(x) for x in ratios],
        "metric": [r6(s["metric"]) for s in sums],
        "S_means": [r6(x) for x in s_means],
        "stall_fractions": [r6(x) for x in fractions],
        "divergences": [r6(x) for x in divergences],
        "mean_step_ms": [round(s["mean_step_ms"], 3) for s in sums],
        "stall_ms_per_step": [round(s.get("stall_ms_per_step", 0.0), 3) for s in sums],
    }


def section(a, cal, results, settings, trainings, runtime_s):
    seeds = list(range(1, a.seeds + 1))
    workloads = {}
    for w in a.workload_list:
        refs = [results[(w, s, "adamw")] for s in seeds]
        entry = {
            "steps": a.step_counts[w],
            "emulate_round_ms": cal[w]["emulate_round_ms"],
            "round_steps_target": 4,
            "measured_step_ms": round(cal[w]["step_ms"], 3),
            "measured_step_from": "the AdamW references' mean step, mean over seeds",
            "metric": METRIC[w],
            "reference": {
                "optimizer": REFERENCE[w],
                "metric": [r6(r["metric"]) for r in refs],
                "mean_step_ms": [round(r["mean_step_ms"], 3) for r in refs],
            },
        }
        for st in settings:
            entry[st] = setting_entry(refs, [results[(w, s, st)] for s in seeds])
        workloads[w] = entry
    worst = [workloads[w]["default"]["ratio"] for w in WORST_OVER if w in workloads]
    worst = None if not worst or None in worst else max(worst)
    return {
        "method": ("each workload against a zenflowd of its own with --emulate_round_ms = 4 x "
                   "its AdamW reference's step measured in this run (a round about 4 steps); "
                   "per seed ratio = "
                   "zenflow metric / AdamW metric of the same seed (same start, same batches); "
                   "ratio = mean over seeds, ratio_spread = sample standard deviation; "
                   "stall_fraction = stall per step / mean step; S_mean and divergence from "
                   "zf_train's ZF_SUMMARY or zenflow.torch's stats"),
        "quick": bool(a.quick),
        "seeds": seeds,
        "settings": ["adamw"] + list(settings),
        "workloads": workloads,
        "default_worst_ratio": r6(worst),
        "default_worst_ratio_over": list(WORST_OVER),
        "parallel_jobs": a.jobs,
        "trainings": trainings,
        "runtime_s": runtime_s,
    }


def merge(path, sec):
    """Puts sec under "cpu_bound" of the JSON at path (kept), or a new file."""
    doc = {"benchmark": "fidelity"}
    if os.path.exists(path):
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError):
            pass
    doc["cpu_bound"] = sec
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def fmt(x, spec="%.4f"):
    return "-" if x is None else spec % x


def table(sec, out):
    out.write("\nCPU-bound fidelity: zenflow metric / AdamW metric per seed, a round ~ 4 steps "
              "(zenflowd --emulate_round_ms); mean +- spread over seeds %s\n" % sec["seeds"])
    for w, e in sec["workloads"].items():
        out.write("%s (%d steps, step %.2f ms measured, emulate_round_ms %.2f; AdamW %s %s)\n"
                  % (w, e["steps"], e["measured_step_ms"], e["emulate_round_ms"], e["metric"],
                     " ".join("%.5f" % m for m in e["reference"]["metric"])))
        out.write("  %-20s %-18s %-8s %-8s %-10s\n" % ("setting", "ratio", "S_mean", "stall",
                                                     "divergence"))
        for st in sec["settings"][1:]:
            r = e[st]
            if "skipped" in r:
                out.write("  %-20s skipped: %s\n" % (st, r["skipped"][:90]))
                continue
            out.write("  %-20s %-18s %-8s %-8s %-10s\n" % (
                st, "%.4f +- %.4f" % (r["ratio"], r["ratio_spread"]), fmt(r["S_mean"], "%.2f"),
                fmt(r["stall_fraction"], "%.3f"), fmt(r["divergence"], "%.4g")))
    out.write("default_worst_ratio (lm, finetune): %s\n" % fmt(sec["default_worst_ratio"]))
