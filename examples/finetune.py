"""Fine-tune a small GPT-style torch model through zenflowd.

    ./zf python examples/finetune.py                 # starts its own zenflowd
    ./zf python examples/finetune.py --target=HOST:PORT --steps=300

A character-level model is pretrained briefly with torch.optim.AdamW on one
text every Debian system carries (GPL-3; the weights are cached under
~/.cache/zenflow), then fine-tuned on another (Apache-2.0) three ways from the
same start: ZenFlow through zenflowd, ZeRO-Offload through zenflowd (the same
path with every column remote, updated every step, synchronously), and torch's
own AdamW. Printed side by side like `./zf demo`; the loss curves are written
to finetune.svg.
"""

import argparse
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn

import zenflow.torch

PRETRAIN_TEXT = "/usr/share/common-licenses/GPL-3"
FINETUNE_TEXT = "/usr/share/common-licenses/Apache-2.0"


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab=256, width=64, layers=2, heads=4, context=64):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.zeros(context, width))
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)
        mask = torch.triu(torch.full((context, context), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask)

    def forward(self, idx):
        n = idx.shape[1]
        x = self.tok(idx) + self.pos[:n]
        for b in self.blocks:
            x = b(x, self.mask[:n, :n])
        return self.head(self.ln(x))


def load_text(path):
    with open(path, "rb") as f:
        data = torch.tensor(list(f.read()), dtype=torch.long)
    split = int(len(data) * 0.9)
    return data[:split], data[split:]


def get_batch(data, step, batch, context, seed):
    g = torch.Generator().manual_seed(seed * 100003 + step)
    ix = torch.randint(len(data) - context - 1, (batch,), generator=g)
    x = torch.stack([data[i:i + context] for i in ix])
    y = torch.stack([data[i + 1:i + context + 1] for i in ix])
    return x, y


def loss_on(model, x, y):
    logits = model(x)
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


@torch.no_grad()
def validate(model, val, args):
    losses = [loss_on(model, *get_batch(val, i, args.batch, args.context, 999)).item()
              for i in range(8)]
    return sum(losses) / len(losses)


def pretrained(args):
    cache = os.path.expanduser(
        f"~/.cache/zenflow/finetune-pretrained-w{args.width}-l{args.layers}-{args.pretrain_steps}.pt")
    model = TinyGPT(width=args.width, layers=args.layers, context=args.context)
    if os.path.exists(cache):
        model.load_state_dict(torch.load(cache))
        return model
    torch.manual_seed(0)
    model = TinyGPT(width=args.width, layers=args.layers, context=args.context)
    train, _ = load_text(PRETRAIN_TEXT)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    print(f"pretraining {args.pretrain_steps} steps on {PRETRAIN_TEXT} (cached in {cache})")
    for step in range(args.pretrain_steps):
        opt.zero_grad()
        loss_on(model, *get_batch(train, step, args.batch, args.context, 1)).backward()
        opt.step()
    os.makedirs(os.path.dirname(cache), exist_ok=True)
    torch.save(model.state_dict(), cache)
    return model


def train_steps(model, opt, train, steps, args, seed):
    """Runs steps optimizer steps on batches of train drawn by seed; returns the losses.

    The same (seed, step) gives the same batch, so two optimizers given the
    same start and seed see the same data (tools/fidelity compares them so).
    """
    curve = []
    for step in range(steps):
        opt.zero_grad()
        loss = loss_on(model, *get_batch(train, step, args.batch, args.context, seed))
        loss.backward()
        opt.step()
        curve.append(loss.item())
    return curve


def finetune(name, args, target):
    model = pretrained(args)
    train, val = load_text(FINETUNE_TEXT)
    if name == "torch_adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    else:
        opt = zenflow.torch.ZenFlowOptimizer(
            model.parameters(), target=target, job=f"finetune-{name}-{os.getpid()}", lr=args.lr,
            mode=name, wire="bf16", config={"zero_optimization": {"zenflow": {
                "topk_ratio": 0.1, "update_interval": 4, "select_interval": "auto",
                "overlap_step": True}}})
    start = time.perf_counter()
    curve = train_steps(model, opt, train, args.steps, args, seed=2)
    stats = None
    if name != "torch_adamw":
        opt.finish()
        stats = opt.stats()["totals"]
        opt.close()
    seconds = time.perf_counter() - start
    return {"name": name, "val_loss": validate(model, val, args), "curve": curve,
            "step_ms": 1000 * seconds / args.steps,
            "stall_ms": 1000 * stats["stall_seconds"] / args.steps if stats else 0.0,
            "wire_mb": (stats["bytes_sent"] + stats["bytes_received"]) / 1e6 if stats else 0.0}


def write_svg(results, path):
    w, h, pad = 640, 360, 40
    every = [r["curve"] for r in results]
    lo = min(min(c) for c in every)
    hi = max(max(c) for c in every)
    n = max(len(c) for c in every)
    colors = ["#1f77b4", "#d62728", "#2ca02c"]
    lines = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}">',
             f'<rect width="{w}" height="{h}" fill="white"/>',
             f'<text x="{pad}" y="20" font-family="sans-serif" font-size="13">'
             f'fine-tuning loss per step ({lo:.2f} to {hi:.2f})</text>']
    for i, (r, c) in enumerate(zip(results, colors)):
        k = max(1, len(r["curve"]) // 200)  # smooth: mean of k steps
        pts = []
        for j in range(0, len(r["curve"]) - k + 1, k):
            v = sum(r["curve"][j:j + k]) / k
            x = pad + (w - 2 * pad) * j / max(1, n - 1)
            y = h - pad - (h - 2 * pad) * (v - lo) / max(1e-9, hi - lo)
            pts.append(f"{x:.1f},{y:.1f}")
        lines.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.5" points="{" ".join(pts)}"/>')
        lines.append(f'<text x="{w - 200}" y="{40 + 16 * i}" font-family="sans-serif" '
                     f'font-size="12" fill="{c}">{r["name"]}: val {r["val_loss"]:.4f}</text>')
    lines.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def parse_args(argv=None):
    """The command line's settings (argv None: sys.argv; [] gives the defaults)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", help="a running zenflowd (default: start one on loopback)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--pretrain_steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--plot", default="finetune.svg")
    return ap.parse_args(argv)


def main():
    args = parse_args()
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))

    daemon = None
    target = args.target
    if target is None:
        binary = os.environ.get("ZENFLOWD")
        if not binary:
            sys.exit("no --target and no ZENFLOWD: run through ./zf python, or pass --target")
        d = tempfile.mkdtemp()
        port_file = os.path.join(d, "port")
        daemon = subprocess.Popen([binary, "--listen=127.0.0.1:0", f"--port_file={port_file}"],
                                  stderr=open(os.path.join(d, "zenflowd.log"), "w"))
        for _ in range(300):
            if os.path.exists(port_file) and os.path.getsize(port_file) > 0:
                break
            time.sleep(0.05)
        with open(port_file) as f:
            target = f"127.0.0.1:{f.read().strip()}"
        print(f"started zenflowd on {target} (log: {d}/zenflowd.log)")
    try:
        pretrained(args)
        results = [finetune(n, args, target) for n in ("zenflow", "zero_offload", "torch_adamw")]
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.wait()
    if daemon is not None:
        shutil.rmtree(d, ignore_errors=True)  # a run that got here needs no log
    print(f"\nfine-tuned {args.steps} steps on {FINETUNE_TEXT} "
          f"(model {args.layers} layers x {args.width} wide)")
    print(f"{'optimizer':<14}{'val loss':>10}{'step ms':>10}{'stall ms':>10}{'wire MB':>10}")
    for r in results:
        print(f"{r['name']:<14}{r['val_loss']:>10.4f}{r['step_ms']:>10.2f}"
              f"{r['stall_ms']:>10.2f}{r['wire_mb']:>10.2f}")
    write_svg(results, args.plot)
    print(f"loss curves: {args.plot}")
    if not all(math.isfinite(r["val_loss"]) for r in results):
        sys.exit("a validation loss is not finite")


if __name__ == "__main__":
    main()
