#!/usr/bin/env python3
"""torch_workloads.py: the torch workloads of the fidelity bench's CPU-bound section.

    torch_workloads.py --workload=finetune|mlp --seed=N --steps=N [--target=HOST:PORT]
                       [--runs=adamw,default,fixed_S2,...] [--prepare]
                       [--pretrain_steps=N] [--job_prefix=P]

Run by tools/fidelity/cpu_bound.py (with /usr/bin/python3 and the zenflow
package on PYTHONPATH, as `./zf python` does). Each run of --runs trains the
workload from the same start on the same batches (those of --seed) and prints
one line "ZF_SUMMARY {json}" with its name, final metric, mean step time,
stall per step, S_mean and divergence (zenflow runs), or "skipped" and why.
--prepare only makes the start (finetune's pretraining, cached), so that
runs started after it, two at a time, do not race to write the cache.

Workloads:
  finetune  examples/finetune.py's TinyGPT (2 layers, width 64, context 64,
            batch 8), pretrained by finetune.py's own code on GPL-3 (cached
            under ~/.cache/zenflow), fine-tuned on Apache-2.0 at finetune.py's
            lr 1e-3 (weight decay 0.01, torch's and zenflow's default) with
            finetune.train_steps; the batches are drawn by --seed; metric:
            finetune.validate's loss on its fixed 8 validation batches.
  mlp       an MLP 32-128-128-4 (ReLU) from scratch (torch.manual_seed(seed)),
            regressing a fixed random teacher, x -> tanh(x T1) T2 with T1
            32x64 ~ N(0, 1/32) and T2 64x4 ~ N(0, 1/64) drawn from a generator
            seeded 1000 + seed, on x ~ N(0, I); batch 64 drawn by a generator
            seeded with the seed; AdamW lr 1e-3, weight decay 0.01; metric: the
            MSE on a fixed validation set of 4096 points (generator seed 99).
            The same task as the issue's independent emulation of the rules.

Runs: adamw (torch.optim.AdamW, the reference), default (ZenFlowOptimizer
with every job option at its default: update_interval auto, adaptive delay),
fixed_S<N> (update_interval N, the rest default), fixed_S4_rules_off
(update_interval 4, scale_round_step=False, local_step=False; "skipped" where
the package does not know those keywords). Every run is single threaded
(torch.set_num_threads(1), the engine's threads=1): two run at a time.
"""

import argparse
import json
import math
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))

import finetune  # noqa: E402  examples/finetune.py: its model, data and pretraining
import zenflow.torch  # noqa: E402

RULES_OFF = {"scale_round_step": False, "local_step": False}


def zenflow_options(run):
    """The ZenFlowOptimizer keywords of a run other than the reference."""
    if run == "default":
        return {}
    if run == "fixed_S4_rules_off":
        return dict(update_interval=4, **RULES_OFF)
    if run.startswith("fixed_S") and run[len("fixed_S"):].isdigit():
        return {"update_interval": int(run[len("fixed_S"):])}
    raise ValueError(f"unknown run {run!r}")


class FinetuneWorkload:
    lr = 1e-3
    weight_decay = 0.01

    def __init__(self, seed, pretrain_steps):
        self.args = finetune.parse_args([f"--pretrain_steps={pretrain_steps}"])
        self.seed = seed
        self.train, self.val = finetune.load_text(finetune.FINETUNE_TEXT)

    def model(self):
        return finetune.pretrained(self.args)

    def steps(self, model, opt, steps, on_step):
        a = self.args
        for t in range(steps):
            opt.zero_grad()
            finetune.loss_on(model, *finetune.get_batch(self.train, t, a.batch, a.context,
                                                        self.seed)).backward()
            opt.step()
            on_step()

    def metric(self, model):
        return finetune.validate(model, self.val, self.args)


class MlpWorkload:
    lr = 1e-3
    weight_decay = 0.01
    batch = 64

    def __init__(self, seed, _pretrain_steps):
        self.seed = seed
        g = torch.Generator().manual_seed(1000 + seed)
        self.t1 = torch.randn(32, 64, generator=g) / math.sqrt(32)
        self.t2 = torch.randn(64, 4, generator=g) / math.sqrt(64)
        self.val_x, self.val_y = self.sample(4096, torch.Generator().manual_seed(99))

    def sample(self, n, gen):
        x = torch.randn(n, 32, generator=gen)
        return x, torch.tanh(x @ self.t1) @ self.t2

    def model(self):
        torch.manual_seed(self.seed)
        return torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(),
                                   torch.nn.Linear(128, 128), torch.nn.ReLU(),
                                   torch.nn.Linear(128, 4))

    def steps(self, model, opt, steps, on_step):
        gen = torch.Generator().manual_seed(self.seed)
        for _ in range(steps):
            x, y = self.sample(self.batch, gen)
            opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
            on_step()

    @torch.no_grad()
    def metric(self, model):
        return ((model(self.val_x) - self.val_y) ** 2).mean().item()


WORKLOADS = {"finetune": FinetuneWorkload, "mlp": MlpWorkload}


def timed(work, model, opt, steps):
    """Trains; returns the mean wall-clock ms of a step (forward, backward, optimizer)."""
    t0 = time.perf_counter()
    work.steps(model, opt, steps, lambda: None)
    return 1e3 * (time.perf_counter() - t0) / max(1, steps)


def run_one(work, run, flags):
    model = work.model()
    out = {"name": run, "steps": flags.steps}
    if run == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=work.lr, weight_decay=work.weight_decay)
        out["mean_step_ms"] = timed(work, model, opt, flags.steps)
        out["metric"] = work.metric(model)
        return out
    options = zenflow_options(run)
    job = f"{flags.job_prefix}-{flags.workload}-s{flags.seed}-{run}"
    try:
        opt = zenflow.torch.ZenFlowOptimizer(
            model.parameters(), target=flags.target, job=job, lr=work.lr,
            weight_decay=work.weight_decay, threads=1, **options)
    except TypeError as e:
        # A package without rule 12/13's keywords (docs/design.md rules 12 and 13).
        rules = sorted(k for k in options if k in RULES_OFF)
        if not rules:
            raise
        return dict(out, skipped=f"zenflow.torch does not take {', '.join(rules)}: {e}")
    try:
        out["mean_step_ms"] = timed(work, model, opt, flags.steps)
        opt.finish()
        stats = opt.stats()
    finally:
        opt.close()
    totals = stats["totals"]
    out["metric"] = work.metric(model)
    out["stall_ms_per_step"] = 1e3 * totals["stall_seconds"] / max(1, flags.steps)
    out["s_mean"] = (totals["round_steps"] / totals["rounds_closed"]
                     if totals.get("rounds_closed") else None)
    out["rounds_closed"] = totals.get("rounds_closed")
    div = stats.get("divergence", totals.get("divergence"))
    out["divergence"] = div
    out["wire_bytes_per_step"] = (totals["bytes_sent"] + totals["bytes_received"]) / max(1, flags.steps)
    out["spec_zenflow"] = opt.spec.get("zenflow")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--target", default="")
    ap.add_argument("--runs", default="adamw")
    ap.add_argument("--prepare", action="store_true",
                    help="only make the start (finetune: pretrain into the cache)")
    ap.add_argument("--pretrain_steps", type=int, default=300)
    ap.add_argument("--job_prefix", default=f"fid-cpu-{os.getpid()}")
    flags = ap.parse_args()
    torch.set_num_threads(1)
    work = WORKLOADS[flags.workload](flags.seed, flags.pretrain_steps)
    if flags.prepare:
        work.model()
        return
    for run in flags.runs.split(","):
        print("ZF_SUMMARY " + json.dumps(run_one(work, run, flags)), flush=True)


if __name__ == "__main__":
    main()
