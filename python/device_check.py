"""The device check of zenflow.torch with CUDA tensors (run by
tools/gpu_run.sh where a Python 3.11 with a CUDA-enabled torch exists; the
bundle puts the zenflow package and its _zenflow on PYTHONPATH).

The same small model is optimized from CPU tensors (the CPU backend) and
from CUDA tensors (the CUDA backend, ordered with torch's current stream)
with the same gradients (made on the host, copied into p.grad without
waiting), in each mode; the parameters must come out the same, bit for bit.
A short autograd run on the device follows (its loss must stay finite).

    python3.11 python/device_check.py --target=127.0.0.1:50051
Prints one ZF_SUMMARY line per check; exit 1 on a failure.
"""

import argparse
import os
import sys

import torch

import zenflow.torch


def make(dtype, device):
    torch.manual_seed(5)
    m = torch.nn.Sequential(torch.nn.Linear(96, 64), torch.nn.Tanh(), torch.nn.Linear(64, 32))
    return m.to(dtype).to(device)


def grads(m, step):
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(p.shape, generator=g) * (1 + (step % 3)) for p in m.parameters()]


def run(target, mode, dtype, device, steps):
    m = make(dtype, device)
    kw = dict(topk_ratio=0.25, update_interval=2, select_interval=4, full_warm_up_rounds=1,
              apply_delay=1, wire="bf16") if mode == "zenflow" else dict(wire="fp32")
    job = f"devcheck-{mode}-{dtype}-{device}-{os.getpid()}".replace("torch.", "")
    with zenflow.torch.ZenFlowOptimizer(m.parameters(), target=target, job=job, lr=1e-2,
                                        mode=mode, **kw) as opt:
        for t in range(steps):
            for p, g in zip(m.parameters(), grads(m, t)):
                p.grad.copy_(g.to(dtype), non_blocking=True)
            opt.step()
    return [p.detach().cpu() for p in m.parameters()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--steps", type=int, default=8)
    a = ap.parse_args()
    assert torch.cuda.is_available(), "no CUDA device for torch"
    failed = 0
    for mode in ("zenflow", "zero_offload"):
        for dtype in (torch.float32, torch.bfloat16):
            cpu = run(a.target, mode, dtype, "cpu", a.steps)
            cuda = run(a.target, mode, dtype, "cuda", a.steps)
            bits = lambda t: t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(torch.int32)
            differing = sum(int((bits(x) != bits(y)).sum()) for x, y in zip(cpu, cuda))
            diff = max(float((x.float() - y.float()).abs().max()) for x, y in zip(cpu, cuda))
            ok = differing == 0
            failed += not ok
            print(f"ZF_SUMMARY torch_cuda_check mode={mode} dtype={dtype} differing={differing} "
                  f"max_abs_diff={diff:g} {'PASSED' if ok else 'FAILED'}", flush=True)
    # Autograd on the device, torch's own stream order.
    m = make(torch.float32, "cuda")
    x, y = torch.randn(64, 96, device="cuda"), torch.randn(64, 32, device="cuda")
    with zenflow.torch.ZenFlowOptimizer(m.parameters(), target=a.target,
                                        job=f"devcheck-train-{os.getpid()}", lr=1e-3) as opt:
        losses = []
        for _ in range(20):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(m(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        stats = opt.stats()["totals"]
    ok = all(map(lambda v: v == v and abs(v) < 1e9, losses)) and losses[-1] < losses[0]
    failed += not ok
    print(f"ZF_SUMMARY torch_cuda_check train loss {losses[0]:.4f} -> {losses[-1]:.4f} "
          f"stall_s={stats['stall_seconds']:.3f} {'PASSED' if ok else 'FAILED'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
