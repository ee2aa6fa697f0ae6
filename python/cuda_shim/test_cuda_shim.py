"""The CUDA path of the extension under a fake CUDA runtime (fake_cudart.cc,
LD_PRELOADed by cuda_shim_test.sh): device arrays reach the CUDA backend,
whose work is ordered with the caller's stream by events, the stream
handle passed through as given; never a device-wide synchronize. The fake
runs no kernel, so this checks the ORDER of runtime calls, not numbers
(the device check, gpu_worker/cuda_path_check.cc, checks those on a GPU).
"""

import os
import re

import numpy as np
import pytest

import _zenflow
import zenflow
from array_helpers import Interface, serve, spec

CALLER = 0xABC0      # the caller's stream, as torch.cuda.current_stream().cuda_stream
OTHER = 0xDEF0       # another caller stream, for one step


@pytest.fixture(scope="module")
def daemon():
    yield from serve()


def log_path():
    path = os.environ.get("ZF_FAKE_CUDA_LOG")
    assert path, "run under cuda_shim_test.sh (LD_PRELOAD=fake_cudart.so, ZF_FAKE_CUDA_LOG)"
    return path


def mark(text):
    with open(log_path(), "a") as f:
        f.write(f"# {text}\n")


def sections():
    """The log as {mark: [call lines]} (calls before the first mark dropped)."""
    out, cur = {}, None
    for line in open(log_path()).read().splitlines():
        if line.startswith("# "):
            cur = line[2:]
            out[cur] = []
        elif cur is not None:
            out[cur].append(line)
    return out


def arrays(cuda=True):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 16), dtype=np.float32)
    b = rng.standard_normal(8, dtype=np.float32)
    gw, gb = np.zeros_like(w), np.zeros_like(b)
    return [("p0", Interface(w, cuda), Interface(gw, cuda)),
            ("p1", Interface(b, cuda), Interface(gb, cuda))], (w, b, gw, gb)


def field(line, key):
    return re.search(rf"\b{key}=(\S+)", line).group(1)


def check_ordered(calls, caller, backend):
    """calls begin with the backend's stream waiting for the caller's and end
    with the caller's waiting for the backend's; in between, work on the
    backend's stream only."""
    calls = [c for c in calls if not c.startswith("cudaPointerGetAttributes")]
    assert calls[0].startswith("cudaEventRecord") and field(calls[0], "stream") == caller, calls[:2]
    assert calls[1].startswith("cudaStreamWaitEvent"), calls[:2]
    assert field(calls[1], "stream") == backend and field(calls[1], "event") == field(calls[0], "event")
    assert calls[-2].startswith("cudaEventRecord") and field(calls[-2], "stream") == backend, calls[-2:]
    assert calls[-1].startswith("cudaStreamWaitEvent"), calls[-2:]
    assert field(calls[-1], "stream") == caller
    assert field(calls[-1], "event") == field(calls[-2], "event")
    middle = calls[2:-2]
    for c in middle:
        if "stream=" in c and not c.startswith("cudaStreamCreate"):
            assert field(c, "stream") == backend, f"work off the backend's stream: {c}"
    return middle


def test_device_arrays_run_on_the_cuda_backend_ordered_with_the_callers_stream(daemon):
    params, _ = arrays()
    mark("create")
    w = _zenflow.Worker(spec("shim", [(8, 16), (8,)]), 0, daemon, "grpc", 0.0, 20.0, 1, params,
                        stream=CALLER)
    assert (w.backend(), w.device()) == ("cuda", 0)
    for t in range(4):
        mark(f"step {t}")
        w.step(t, 1e-2, stream=OTHER if t == 2 else None)  # None: the stream given at creation
    mark("finish")
    w.finish()
    mark("end")
    w.end_job()
    w.close()
    log = sections()
    everything = [c for calls in log.values() for c in calls]
    assert not [c for c in everything if c.startswith("cudaDeviceSynchronize")]
    backend = field(next(c for c in log["create"] if c.startswith("cudaStreamCreateWithFlags")),
                    "stream")
    caller, other = f"0x{CALLER:x}", f"0x{OTHER:x}"
    assert backend not in (caller, other)
    # Creating: the parameters' initial values are read (device to host)
    # after the backend's stream waited for the caller's.
    create = [c for c in log["create"]
              if not c.startswith(("cudaPointerGetAttributes", "cudaStreamCreate", "cudaMalloc",
                                   "cudaMemsetAsync", "cudaStreamSynchronize", "cudaEventCreate"))]
    read = next(i for i, c in enumerate(create) if c.startswith("cudaMemcpyAsync kind=2"))
    assert create[0].startswith("cudaEventRecord") and field(create[0], "stream") == caller
    assert read > 1 and field(create[1], "stream") == backend
    for t in range(4):
        middle = check_ordered(log[f"step {t}"], other if t == 2 else caller, backend)
        # The step's work: kernels on the backend's stream (packing the
        # gradients), the backend's stream waited for (not the device), and
        # after the first steps no allocation or free (the staging is reused).
        assert any(c.startswith("cudaLaunchKernel") for c in middle)
        assert any(c.startswith("cudaStreamSynchronize") for c in middle)
        if t >= 2:
            assert not [c for c in middle if c.startswith(("cudaMalloc", "cudaFree"))], middle
    check_ordered(log["finish"], caller, backend)


def test_two_devices_in_one_optimizer_are_refused(daemon):
    params, (w, b, gw, gb) = arrays()
    params[1] = ("p1", Interface(b, True, data=(1 << 56) | b.ctypes.data), Interface(gb, True))
    with pytest.raises(zenflow.ZenFlowError) as e:
        _zenflow.Worker(spec("two_devices", [(8, 16), (8,)]), 0, daemon, "grpc", 0.0, 20.0, 1,
                        params, stream=CALLER)
    assert e.value.code == "INVALID_ARGUMENT"
    assert "parameter 'p1' is on CUDA device 1 but parameter 'p0' on device 0" in e.value.message
    assert "one optimizer per device" in e.value.message
    # The next good worker runs.
    params, _ = arrays()
    w = _zenflow.Worker(spec("after_two", [(8, 16), (8,)]), 0, daemon, "grpc", 0.0, 20.0, 1,
                        params, stream=CALLER)
    w.step(0, 1e-2)
    w.finish()
    w.end_job()
    w.close()
