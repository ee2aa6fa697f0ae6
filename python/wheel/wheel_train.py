"""A user's own training script, for wheel_test.sh: run from a directory of
its own by the venv's python (no PYTHONPATH), it imports zenflow from the
installed wheel, trains a small torch model for a few steps against the
zenflowd at $ZENFLOW_TARGET and checks that the daemon's columns moved the
model and the loss fell. Its settings are read from a file named relative
to the working directory, as a user's would be.
"""

import json
import os
import sys

import torch

import zenflow
import zenflow.torch

settings = json.load(open(sys.argv[1]))  # a relative path: the caller's cwd counts
here = os.path.dirname(os.path.abspath(zenflow.__file__))
if not here.startswith(sys.prefix):
    raise SystemExit(f"zenflow was imported from {here}, not from the venv {sys.prefix}")

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
x = torch.randn(64, 16)
y = torch.randint(0, 4, (64,))
before = [p.detach().clone() for p in model.parameters()]
opt = zenflow.torch.ZenFlowOptimizer(model.parameters(), target=os.environ["ZENFLOW_TARGET"],
                                     job=f"wheel-test-{os.getpid()}", lr=settings["lr"])
losses = []
with opt:
    for _ in range(settings["steps"]):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    totals = opt.stats()["totals"]
moved = sum(int(not torch.equal(a, b.detach())) for a, b in zip(before, model.parameters()))
print(f"wheel_train: zenflow from {here}; {len(losses)} steps, loss {losses[0]:.4f} -> "
      f"{losses[-1]:.4f}; {moved} of {len(before)} tensors moved; totals {totals}")
if not losses[-1] < losses[0]:
    raise SystemExit("wheel_train: the loss did not fall")
if moved != len(before):
    raise SystemExit("wheel_train: some parameters never changed")
