"""Helpers of the framework-neutral tests (test_arrays.py and
python/cuda_shim/test_cuda_shim.py): a zenflowd on loopback, arrays that
expose an array interface, and a job spec for _zenflow.Worker. No torch."""

import json
import os
import subprocess
import tempfile
import time


def serve():
    """Starts a zenflowd ($ZENFLOWD) on a free loopback port; yields its target."""
    binary = os.environ.get("ZENFLOWD")
    assert binary and os.path.exists(binary), "set ZENFLOWD to the zenflowd binary"
    d = tempfile.mkdtemp()
    port_file = os.path.join(d, "port")
    log = open(os.path.join(d, "zenflowd.log"), "w")
    proc = subprocess.Popen([binary, "--listen=127.0.0.1:0", f"--port_file={port_file}",
                             "--max_jobs_per_credential=256"], stderr=log)
    for _ in range(300):
        if os.path.exists(port_file) and os.path.getsize(port_file) > 0:
            break
        assert proc.poll() is None, "zenflowd exited"
        time.sleep(0.05)
    with open(port_file) as f:
        target = f"127.0.0.1:{f.read().strip()}"
    yield target
    proc.terminate()
    proc.wait(timeout=30)


class Interface:
    """An object exposing `a`'s memory (a NumPy array) through
    __cuda_array_interface__ (cuda=True: the memory is handed over as device
    memory, as a fake CUDA runtime or a test of refusals wants) or
    __array_interface__. `data` replaces the pointer; `typestr`, `descr` and
    `strides` override; bf16=True marks uint16 storage as bfloat16."""

    def __init__(self, a, cuda=False, data=None, typestr=None, strides="auto", bf16=False):
        self.array = a  # keeps the memory alive
        typestr = typestr or ("<V2" if bf16 else a.__array_interface__["typestr"])
        iface = {"shape": tuple(a.shape), "typestr": typestr,
                 "descr": [("bfloat16" if bf16 else "", typestr)],
                 "data": (a.ctypes.data if data is None else data, False),
                 "strides": None if strides == "auto" and a.flags.c_contiguous else
                 (tuple(a.strides) if strides == "auto" else strides),
                 "version": 3}
        if cuda:
            self.__cuda_array_interface__ = iface
        else:
            self.__array_interface__ = iface


def spec(job, shapes, mode="MODE_ZERO_OFFLOAD", wire="DTYPE_FP32", dtypes=None, **zenflow):
    """A JobSpec as JSON for tensors p0, p1, ... of `shapes` (lr 1e-2, wd 0.01)."""
    dtypes = dtypes or ["DTYPE_FP32"] * len(shapes)
    return json.dumps({
        "jobId": job,
        "tensors": [{"name": f"p{i}", "shape": list(s), "dtype": d}
                    for i, (s, d) in enumerate(zip(shapes, dtypes))],
        "adamw": {"lr": 1e-2, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weightDecay": 0.01},
        "zenflow": zenflow, "mode": mode, "worldSize": 1, "wireDtype": wire,
    })
