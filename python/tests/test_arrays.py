"""The framework-neutral layer of the extension: parameters and gradients as
objects with an array interface. Host arrays (__array_interface__, the CPU
backend) give what zenflow.torch gives, bit for bit; an object with
__cuda_array_interface__ reaches the CUDA backend, which without a device
answers UNAVAILABLE; mixed placement, non-contiguous, fp64 and 16-bit
gradients are refused with the fix. (The stream's path under a fake CUDA
runtime: python/cuda_shim.)"""

import json

import numpy as np
import pytest
import torch

import _zenflow
import zenflow
import zenflow.torch
from array_helpers import Interface, serve, spec


@pytest.fixture(scope="module")
def daemon():
    yield from serve()


def worker(target, job, params, shapes, **kw):
    return _zenflow.Worker(spec(job, shapes, **kw), 0, target, "grpc", 0.0, 5.0, 2, params)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_host_arrays_equal_the_torch_path_bit_for_bit(daemon, monkeypatch, dtype):
    torch.manual_seed(3)
    m = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(),
                            torch.nn.Linear(16, 4)).to(dtype)
    initial = [p.detach().clone() for p in m.parameters()]
    sent = {}
    real = _zenflow.Worker

    def capture(spec_json, *args, **kwargs):  # the spec zenflow.torch sends
        sent["spec"] = json.loads(spec_json)
        return real(spec_json, *args, **kwargs)

    monkeypatch.setattr(zenflow.torch._zenflow, "Worker", capture)
    grads = []
    with zenflow.torch.ZenFlowOptimizer(m.parameters(), target=daemon, job=f"torch_{dtype}",
                                        lr=1e-2, topk_ratio=0.25, update_interval=2,
                                        select_interval=4, full_warm_up_rounds=1,
                                        apply_delay=1, wire="bf16") as opt:
        for t in range(10):
            opt.zero_grad()
            g = torch.Generator().manual_seed(t)
            x, y = torch.randn(8, 12, generator=g), torch.randn(8, 4, generator=g)
            torch.nn.functional.mse_loss(m(x.to(dtype)).float(), y).backward()
            grads.append([p.grad.float().clone() for p in m.parameters()])
            opt.step()
    monkeypatch.undo()

    # The same job from NumPy arrays: fp32 as is, bf16 as its uint16 bits.
    def host(t):
        if t.dtype == torch.bfloat16:
            return Interface(t.view(torch.int16).numpy().view(np.uint16).copy(), bf16=True)
        return Interface(t.numpy().copy())

    params = [host(p) for p in initial]
    gbufs = [np.zeros(p.shape, dtype=np.float32) for p in initial]
    s = dict(sent["spec"], jobId=f"arrays_{dtype}")
    w = _zenflow.Worker(json.dumps(s), 0, daemon, "grpc", 0.0, 5.0, 2,
                        [(f"p{i}", p, Interface(g)) for i, (p, g) in enumerate(zip(params, gbufs))])
    assert (w.backend(), w.device()) == ("cpu", -1)
    for t, step_grads in enumerate(grads):
        for buf, g in zip(gbufs, step_grads):
            buf[...] = g.numpy()
        w.step(t, 1e-2)
    w.finish()
    w.end_job()
    w.close()
    for i, (p, mine) in enumerate(zip(m.parameters(), params)):
        if dtype == torch.bfloat16:
            want = p.detach().view(torch.int16).numpy().view(np.uint16)
        else:
            want = p.detach().numpy()
        assert np.array_equal(mine.array, want), f"parameter {i} differs"
    assert any(not torch.equal(a, b.detach()) for a, b in zip(initial, m.parameters()))


def test_a_cuda_array_reaches_the_cuda_backend_unavailable_without_a_device(daemon):
    w, g = np.zeros((4, 8), np.float32), np.zeros((4, 8), np.float32)
    with pytest.raises(zenflow.ZenFlowError) as e:
        worker(daemon, "cuda_here", [("p0", Interface(w, cuda=True), Interface(g, cuda=True))],
               [(4, 8)])
    if torch.cuda.is_available():  # a real device: this host memory is not device memory
        assert e.value.code == "INVALID_ARGUMENT" and "host memory" in e.value.message
        return
    # From the CUDA backend (a CUDA build: its device query; without CUDA:
    # its stub), not a refusal in Python.
    assert e.value.code == "UNAVAILABLE", e.value
    assert ("no CUDA device is visible" in e.value.message
            or "built without CUDA" in e.value.message), e.value.message
    # The next good worker, from host arrays, runs.
    w2 = worker(daemon, "after_cuda", [("p0", Interface(w), Interface(g))], [(4, 8)])
    w2.step(0, 1e-2)
    w2.finish()
    w2.end_job()
    w2.close()


def refusal(params, shapes):
    with pytest.raises(zenflow.ZenFlowError) as e:
        # No daemon is reached: the arrays are checked before connecting.
        _zenflow.Worker(spec("refused", shapes), 0, "127.0.0.1:1", "grpc", 0.0, 1.0, 1, params)
    assert e.value.code == "INVALID_ARGUMENT", e.value
    return e.value.message


def test_bad_arrays_are_refused_with_what_to_do():
    a, g = np.zeros((4, 8), np.float32), np.zeros((4, 8), np.float32)
    b, gb = np.zeros(4, np.float32), np.zeros(4, np.float32)
    msg = refusal([("p0", Interface(a), Interface(g)),
                   ("p1", Interface(b, cuda=True), Interface(gb, cuda=True))], [(4, 8), (4,)])
    assert "parameter 'p1' is on a CUDA device but parameter 'p0' is in host memory" in msg
    assert "model.to(device)" in msg
    msg = refusal([("p0", Interface(a, cuda=True), Interface(g))], [(4, 8)])
    assert "the gradient of parameter 'p0' is in host memory" in msg
    t = np.zeros((8, 4), np.float32).T  # a transpose: strides (4, 16)
    msg = refusal([("p0", Interface(t), Interface(g))], [(4, 8)])
    assert "parameter 'p0' is not contiguous" in msg and "contiguous()" in msg
    msg = refusal([("p0", Interface(a.astype(np.float64)), Interface(g))], [(4, 8)])
    assert "parameter 'p0' is float64" in msg and "model.float()" in msg
    msg = refusal([("p0", Interface(a), Interface(g.astype(np.float16)))], [(4, 8)])
    assert "the gradient of parameter 'p0' is float16" in msg
    msg = refusal([("p0", [0.0] * 32, Interface(g))], [(4, 8)])
    assert "a list exposes neither __cuda_array_interface__ nor __array_interface__" in msg


def test_a_non_contiguous_torch_parameter_is_refused_with_the_fix():
    p = torch.nn.Parameter(torch.randn(8, 4).t())
    with pytest.raises(zenflow.ZenFlowError) as e:
        zenflow.torch.ZenFlowOptimizer([p], target="127.0.0.1:1", connect_timeout=1.0)
    assert e.value.code == "INVALID_ARGUMENT"
    assert "parameter 'p0' is not contiguous" in e.value.message
