#!/usr/bin/env python3
"""cpu_bound.py: the fidelity bench's CPU-bound section (issue 29, part 1).

    cpu_bound.py --out=PATH --zf_train=BIN --zenflowd=BIN --lm_flags="..."
                 [--lm_init=PARAMS] [--seeds=N] [--jobs=N] [--quick]
                 [--steps=LM,FINETUNE,MLP] [--pretrain_steps=N]
                 [--workloads=lm,finetune,mlp]

tools/bench_fidelity.sh runs it (after its grid, or alone with
--cpu_bound_only), with /usr/bin/python3 and the zenflow package importable
(PYTHONPATH=python:<dir of _zenflow.so>, as `./zf python` sets it).

Fidelity where offloading matters: each workload runs against a zenflowd of
its own started with --emulate_round_ms=N, N = 4 x the workload's measured
step, so that a round takes about four steps and update_interval auto must
choose S > 1. The step is measured in the same run: the AdamW references
(zf_train --mode=local for lm, torch.optim.AdamW for the torch workloads) run
first, two at a time as the zenflow runs then are, and N is 4 x their mean
step over the seeds; it is recorded beside N (the machine is shared, so it
moves from run to run: a separate short run measured under other load than
the trainings had, up to 8 times off here).

Workloads (tools/fidelity/torch_workloads.py says more of the torch two):
  lm        the demo's LM fine-tuning through zf_train, as the grid runs it
            (pretrained start from bench_fidelity.sh's cache, Apache-2.0,
            one rank, --threads=1); metric: validation loss.
  finetune  examples/finetune.py's TinyGPT through zenflow.torch; metric:
            validation loss.
  mlp       an MLP 32-128-128-4 regression from scratch through zenflow.torch;
            metric: validation MSE.
Settings per workload and seed: the AdamW reference (torch.optim.AdamW, or
zf_train --mode=local: same start, same batches), "default" (every job option
at its default: update_interval auto, adaptive delay), fixed_S2, fixed_S4,
fixed_S8 (update_interval fixed, the rest default) and fixed_S4_rules_off
(fixed S 4, scale_round_step and local_step off, docs/design.md rules 12
and 13; written "skipped" with the reason where the build does not take
them). ratio = zenflow metric / reference metric of the same seed; "ratio"
is its mean over seeds, "ratio_spread" the sample standard deviation.

The section goes into --out's "cpu_bound" key: the file's other keys stay
(a fresh file holds the section alone). Timing: tools/bench_fidelity.sh's
header.
"""

import argparse
import concurrent.futures
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import cpu_bound_report  # noqa: E402

SETTINGS = ["default", "fixed_S2", "fixed_S4", "fixed_S8", "fixed_S4_rules_off"]
ROUND_STEPS = 4  # a round takes about this many of the workload's steps
LM_SETTING_FLAGS = {
    "default": [],
    "fixed_S2": ["--interval=2"],
    "fixed_S4": ["--interval=4"],
    "fixed_S8": ["--interval=8"],
    "fixed_S4_rules_off": ["--interval=4", "--scale_round_step=false", "--local_step=false"],
}
UNKNOWN_FLAG = "Unknown command line flag"
ORDER = {"finetune": 0, "lm": 1, "mlp": 2}  # the pool starts the longest trainings first


def log(msg):
    sys.stderr.write("\033[1mbench_fidelity (cpu_bound):\033[0m %s\n" % msg)
    sys.stderr.flush()


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--zf_train", required=True)
    ap.add_argument("--zenflowd", required=True)
    ap.add_argument("--lm_flags", default="", help="zf_train flags of the lm workload's model and data")
    ap.add_argument("--lm_init", default="", help="the lm workload's pretrained parameters")
    ap.add_argument("--seeds", type=int, default=0, help="seeds 1..N (default 3; --quick 1)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--steps", default="", help="LM,FINETUNE,MLP steps (default 304,200,1000; "
                    "--quick 96,32,256)")
    ap.add_argument("--pretrain_steps", type=int, default=300, help="finetune's pretraining")
    ap.add_argument("--workloads", default="lm,finetune,mlp")
    a = ap.parse_args(argv)
    a.seeds = a.seeds or (1 if a.quick else 3)
    steps = (a.steps or ("96,32,256" if a.quick else "304,200,1000")).split(",")
    if len(steps) != 3 or not all(s.isdigit() and int(s) > 0 for s in steps):
        ap.error("--steps wants three positive integers: LM,FINETUNE,MLP")
    a.step_counts = dict(zip(("lm", "finetune", "mlp"), (int(s) for s in steps)))
    if any(n % 8 for n in a.step_counts.values()):
        ap.error("--steps: every count must be a multiple of 8 (every S ends on a round boundary)")
    a.workload_list = [w for w in a.workloads.split(",") if w]
    for w in a.workload_list:
        if w not in a.step_counts:
            ap.error("unknown workload %r (lm, finetune, mlp)" % w)
    if a.jobs < 1 or a.seeds < 1:
        ap.error("--jobs and --seeds must be positive")
    return a


class Bench:
    def __init__(self, a, work):
        self.a = a
        self.work = work
        self.token = os.environ.setdefault(
            "ZENFLOW_TOKEN", "fidelity-cpu-bound-" + os.urandom(12).hex())
        self.daemons = {}
        self.lock = threading.Lock()
        self.done = 0
        self.total = 0

    # ---- processes ---------------------------------------------------------
    def run(self, name, cmd):
        """Runs cmd; returns (rc, stdout, stderr) and keeps both under work/."""
        t0 = time.monotonic()
        p = subprocess.run(cmd, capture_output=True, text=True)
        for ext, text in (("out", p.stdout), ("err", p.stderr)):
            with open(os.path.join(self.work, "%s.%s" % (name, ext)), "w") as f:
                f.write(text)
        with self.lock:
            self.done += 1
            log("  [%2d/%d] %-34s rc %d %5.1fs" % (self.done, self.total, name, p.returncode,
                                                  time.monotonic() - t0))
        return p.returncode, p.stdout, p.stderr

    def torch_cmd(self, workload, *args):
        return [sys.executable, os.path.join(HERE, "torch_workloads.py"),
                "--workload=" + workload, "--pretrain_steps=%d" % self.a.pretrain_steps,
                "--job_prefix=fidcpu-%d" % os.getpid()] + list(args)

    def lm_cmd(self, *args):
        cmd = [self.a.zf_train] + shlex.split(self.a.lm_flags) + ["--threads=1", "--progress=false"]
        if self.a.lm_init:
            cmd.append("--init=" + self.a.lm_init)
        return cmd + list(args)

    @staticmethod
    def lines(stdout, prefix):
        return [json.loads(l[len(prefix) + 1:]) for l in stdout.splitlines()
                if l.startswith(prefix + " ")]

    # ---- finetune's pretraining ------------------------------------------------
    def prepare(self):
        """Pretrains finetune's start once (cached), before two runs could race to."""
        if "finetune" in self.a.workload_list:
            self.total = 1
            rc, _, stderr = self.run("prepare-finetune", self.torch_cmd("finetune", "--prepare"))
            if rc != 0:
                raise SystemExit("finetune's pretraining failed (rc %d):\n%s" % (rc, stderr[-2000:]))

    # ---- daemons -----------------------------------------------------------------
    def start_daemon(self, workload, round_ms):
        d = tempfile.mkdtemp(prefix="zenflowd-%s-" % workload, dir=self.work)
        port_file = os.path.join(d, "port")
        errf = open(os.path.join(d, "zenflowd.log"), "w")
        p = subprocess.Popen([self.a.zenflowd, "--listen=127.0.0.1:0", "--port_file=" + port_file,
                              "--update_threads=1", "--max_jobs=1000",
                              "--max_jobs_per_credential=1000",
                              "--emulate_round_ms=%.3f" % round_ms], stderr=errf)
        self.daemons[workload] = (p, os.path.join(d, "zenflowd.log"))
        for _ in range(300):
            if os.path.exists(port_file) and os.path.getsize(port_file) > 0:
                with open(port_file) as f:
                    return "127.0.0.1:" + f.read().strip()
            if p.poll() is not None:
                break
            time.sleep(0.1)
        with open(os.path.join(d, "zenflowd.log")) as f:
            raise SystemExit("zenflowd (%s) did not start:\n%s" % (workload, f.read()[-2000:]))

    def stop_daemons(self):
        for p, _ in self.daemons.values():
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()

    # ---- the trainings -------------------------------------------------------------
    def reference_tasks(self):
        """(name, workload, seed, ["adamw"], cmd): the AdamW references, the longest first."""
        a = self.a
        out = []
        for w in a.workload_list:
            steps = a.step_counts[w]
            for seed in range(1, a.seeds + 1):
                if w == "lm":
                    cmd = self.lm_cmd("--mode=local", "--steps=%d" % steps, "--seed=%d" % seed)
                else:
                    cmd = self.torch_cmd(w, "--seed=%d" % seed, "--steps=%d" % steps, "--runs=adamw")
                out.append(("%s-s%d-adamw" % (w, seed), w, seed, ["adamw"], cmd))
        return sorted(out, key=lambda t: ORDER[t[1]])

    def zenflow_tasks(self, targets):
        """(name, workload, seed, [settings], cmd): the zenflow runs, the longest first."""
        a = self.a
        out = []
        for w in a.workload_list:
            steps = a.step_counts[w]
            for seed in range(1, a.seeds + 1):
                if w == "lm":
                    for s in SETTINGS:
                        job = "fidcpu-%d-lm-s%d-%s" % (os.getpid(), seed, s)
                        out.append(("lm-s%d-%s" % (seed, s), w, seed, [s], self.lm_cmd(
                            "--mode=zenflow", "--target=" + targets[w], "--job=" + job,
                            "--steps=%d" % steps, "--seed=%d" % seed, *LM_SETTING_FLAGS[s])))
                    continue
                # finetune's runs are long: one process each, for an even pool;
                # mlp's are short: one process per seed (torch's import once).
                groups = ([[s] for s in SETTINGS] if w == "finetune" and not a.quick
                          else [SETTINGS])
                for g in groups:
                    name = "%s-s%d-%s" % (w, seed, g[0] if len(g) == 1 else "zenflow")
                    out.append((name, w, seed, g, self.torch_cmd(
                        w, "--seed=%d" % seed, "--steps=%d" % steps, "--target=" + targets[w],
                        "--runs=" + ",".join(g))))
        return sorted(out, key=lambda t: ORDER[t[1]])

    def train(self, tasks):
        """{(workload, seed, setting): summary dict}; a summary may say "skipped"."""
        self.done, self.total = 0, len(tasks)
        results = {}
        failures = []
        with concurrent.futures.ThreadPoolExecutor(self.a.jobs) as pool:
            futs = [(t, pool.submit(self.run, t[0], t[4])) for t in tasks]
            for (name, w, seed, settings, _), fut in futs:
                rc, stdout, stderr = fut.result()
                got = self.lines(stdout, "ZF_SUMMARY")
                if w == "lm" and rc != 0 and UNKNOWN_FLAG in stderr:
                    # zf_train without rule 12/13's flags (docs/design.md rules 12 and 13).
                    why = next(l for l in stderr.splitlines() if UNKNOWN_FLAG in l)
                    results[(w, seed, settings[0])] = {
                        "skipped": "zf_train does not take the flag: %s" % why.strip()}
                    continue
                if rc != 0 or len(got) != len(settings):
                    failures.append("%s (rc %d): %s" % (name, rc, stderr[-1500:]))
                    continue
                for s, summary in zip(settings, got):
                    if w == "lm":
                        summary = {"metric": summary["val_loss"], **summary}
                    results[(w, seed, s)] = summary
        if failures:
            for w, (_, logf) in self.daemons.items():
                with open(logf) as f:
                    failures.append("zenflowd (%s) log tail:\n%s" % (w, f.read()[-1500:]))
            raise SystemExit("trainings failed:\n" + "\n".join(failures))
        return results


def main():
    a = parse_args()
    t0 = time.monotonic()
    work = tempfile.mkdtemp(prefix="fidelity-cpu-")
    bench = Bench(a, work)
    trainings = 0
    try:
        bench.prepare()
        # The step each N is set from: the AdamW references, run first, two at
        # a time as the zenflow runs then are.
        refs = bench.reference_tasks()
        log("the AdamW references (%s; seeds 1..%d), %d at a time: each workload's step"
            % (", ".join("%s %d steps" % (w, a.step_counts[w]) for w in a.workload_list),
               a.seeds, a.jobs))
        results = bench.train(refs)
        cal, targets = {}, {}
        for w in a.workload_list:
            step = sum(results[(w, s, "adamw")]["mean_step_ms"] for s in range(1, a.seeds + 1)) / a.seeds
            cal[w] = {"step_ms": step, "emulate_round_ms": round(ROUND_STEPS * step, 3)}
            targets[w] = bench.start_daemon(w, cal[w]["emulate_round_ms"])
            log("%s: AdamW step %.2f ms -> zenflowd --emulate_round_ms=%.3f on %s"
                % (w, step, cal[w]["emulate_round_ms"], targets[w]))
        tasks = bench.zenflow_tasks(targets)
        log("%d zenflow trainings, %d at a time" % (len(tasks), a.jobs))
        results.update(bench.train(tasks))
        trainings = len(refs) + len(tasks)
    except BaseException:
        log("the trainings' output is kept in %s" % work)
        raise
    finally:
        bench.stop_daemons()
    shutil.rmtree(work, ignore_errors=True)
    section = cpu_bound_report.section(a, cal, results, SETTINGS, trainings,
                                       round(time.monotonic() - t0, 1))
    cpu_bound_report.merge(a.out, section)
    cpu_bound_report.table(section, sys.stdout)
    log("wrote cpu_bound into %s in %.0fs" % (a.out, time.monotonic() - t0))


if __name__ == "__main__":
    main()
