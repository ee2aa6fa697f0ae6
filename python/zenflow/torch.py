"""ZenFlowOptimizer: a torch.optim.Optimizer whose unimportant columns are
updated by zenflowd.

    import zenflow.torch
    opt = zenflow.torch.ZenFlowOptimizer(model.parameters(), target="127.0.0.1:50051",
                                         job="finetune", lr=1e-4)
    for batch in data:
        loss = model(batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    opt.close()  # the job is deleted once every rank has closed (keep_job=True keeps it)

The worker engine (C++, the same one zf_train runs) updates the important
columns in place every step, streams the other columns' gradients to zenflowd
and applies the columns it sends back. Rank 0 creates the job and uploads the
parameters' initial values; other ranks join it.

A model on a CUDA device runs the engine's CUDA backend on that device: the
extension takes the tensors through their array interfaces
(`__cuda_array_interface__`, or `__array_interface__` for host memory) and
orders its work with torch's current stream by events (docs/python.md,
"CUDA tensors").
"""

import json
import math
import os

import torch

from zenflow import config as _config
from zenflow.errors import ZenFlowError

try:
    import _zenflow
except ImportError as e:  # pragma: no cover: a build problem, said plainly
    raise ImportError(
        "zenflow's extension module _zenflow is not importable: run through `./zf python`, "
        "which builds it (bazel build //python:_zenflow.so) and puts it on the path") from e

# Seconds a worker waits for a daemon that went away (a restart from
# --state_dir) before it fails: a systemd or Kubernetes restart (SIGTERM
# checkpoint, start, restore) fits in it; zf_train's --daemon_wait default.
DEFAULT_DAEMON_WAIT = 300.0

_MODES = {"zenflow": "MODE_ZENFLOW", "zero_offload": "MODE_ZERO_OFFLOAD"}
_WIRES = {"fp32": "DTYPE_FP32", "bf16": "DTYPE_BF16", "fp16": "DTYPE_FP16", "int8": "DTYPE_INT8"}
_PARAM_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def _env_int(*names):
    for n in names:
        v = os.environ.get(n)
        if v not in (None, ""):
            try:
                return int(v)
            except ValueError:
                raise ValueError(f"environment variable {n}={v!r} is not an integer") from None
    return None


def _first(*values):
    return next(v for v in values if v is not None)


_TYPESTRS = {torch.float32: "<f4", torch.float16: "<f2", torch.bfloat16: "<V2",
             torch.float64: "<f8"}


class _Array:
    """A tensor's memory as an array interface, for what torch does not export
    itself: host tensors (torch has no __array_interface__) and bfloat16 ones
    (no typestr: "<V2" with the descr name "bfloat16"). Holds the tensor."""

    def __init__(self, t):
        self.tensor = t
        typestr = _TYPESTRS.get(t.dtype, "|V%d" % t.element_size())
        name = "bfloat16" if t.dtype == torch.bfloat16 else ""
        size = t.element_size()
        iface = {"shape": tuple(t.shape), "typestr": typestr, "descr": [(name, typestr)],
                 "data": (t.data_ptr(), False),
                 "strides": None if t.is_contiguous() else tuple(s * size for s in t.stride()),
                 "version": 3}
        if t.is_cuda:
            iface["stream"] = None  # the stream goes to the extension on its own
            self.__cuda_array_interface__ = iface
        else:
            self.__array_interface__ = iface


def _array(t):
    """What the extension reads: torch's own __cuda_array_interface__ where it
    has one (a CUDA tensor of a dtype with a typestr), else an _Array."""
    if t.is_cuda and t.dtype != torch.bfloat16:
        return t
    return _Array(t)


def _stream(t):
    """torch's current stream on t's device, as the integer the extension takes
    (0 for host tensors)."""
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


def _job_shape(p):
    # [n] or [rows, cols]: tensors of more dimensions are [d0, d1 * d2 * ...].
    if p.dim() == 0:
        return [1]
    if p.dim() == 1:
        return [p.shape[0]]
    return [p.shape[0], math.prod(p.shape[1:])]


class ZenFlowOptimizer(torch.optim.Optimizer):
    """AdamW through zenflowd, ZenFlow's way (or ZeRO-Offload's, mode="zero_offload").

    Keywords (an interface): target ("host:port", or a list of them, or one
    comma-separated string: the job is spread over those daemons, listed in
    the same order on every rank), job, rank, world_size, lr, betas, eps,
    weight_decay, mode ("zenflow" or "zero_offload"), wire ("fp32", "bf16",
    "int8"; "fp16" too), config (a DeepSpeed-style dict or JSON file: see
    zenflow.config). Further keywords: transport ("grpc" or "ucx"),
    topk_ratio, update_interval (steps, or "auto"), select_interval, full_warm_up_rounds,
    apply_delay ("sync", "adaptive", "overlap_step" or steps), predicted_step
    (bool; default true: docs/engine.md, the predicted step), scale_round_step
    (bool; default false: a round of S steps takes one step of S x lr,
    docs/design.md rule 12), local_step (bool; default false: the daemon's
    columns move every step between rounds, rule 13), fidelity_budget (a
    number: the update divergence update_interval auto keeps under; 0 or
    below: no limit; default: the daemon's), daemon_wait
    (seconds to ride through a daemon restart; default 300, enough for a
    systemd or Kubernetes restart of zenflowd with --state_dir; 0 fails at
    once), keep_job (bool; default false: close() on every rank deletes the
    job; true keeps it, checkpointed when zenflowd has --state_dir),
    connect_timeout (seconds), rank_ordered_sums, optimizer_state ("fp32",
    the default, or "8bit": the daemon keeps m and v in 8 bits, block-wise
    quantized; docs/design.md), threads, token (the job's
    token, sent with every call; default: $ZENFLOW_TOKEN; the ranks of a job
    share it, and one rank alone may leave it out: the daemon then makes one),
    tls_ca (PEM file of the CA that signed zenflowd's certificate: TLS on),
    tls_cert and tls_key (this client's certificate, for zenflowd --tls_ca),
    tls_server_name (the name to check, when the target is not it). An
    explicit keyword wins over the config.

    rank and world_size default to the environment (RANK or LOCAL_RANK,
    WORLD_SIZE), as torchrun sets them, else 0 and 1.
    """

    def __init__(self, params, *, target=None, job=None, rank=None, world_size=None,
                 lr=None, betas=None, eps=None, weight_decay=None, mode=None, wire=None,
                 config=None, transport=None, topk_ratio=None, update_interval=None,
                 select_interval=None, full_warm_up_rounds=None, apply_delay=None,
                 predicted_step=None, scale_round_step=None, local_step=None,
                 fidelity_budget=None, daemon_wait=None, connect_timeout=20.0, rank_ordered_sums=None, threads=None,
                 keep_job=None, optimizer_state=None, token=None, tls_ca=None, tls_cert=None, tls_key=None, tls_server_name=None):
        given = dict(target=target, job=job, token=token, tls_ca=tls_ca, tls_cert=tls_cert,
                     tls_key=tls_key, tls_server_name=tls_server_name, lr=lr, betas=betas, eps=eps,
                     weight_decay=weight_decay, mode=mode, wire=wire, transport=transport,
                     topk_ratio=topk_ratio, update_interval=update_interval,
                     select_interval=select_interval, full_warm_up_rounds=full_warm_up_rounds,
                     apply_delay=apply_delay, predicted_step=predicted_step,
                     scale_round_step=scale_round_step, local_step=local_step,
                     fidelity_budget=fidelity_budget, daemon_wait=daemon_wait,
                     rank_ordered_sums=rank_ordered_sums, threads=threads, keep_job=keep_job,
                     optimizer_state=optimizer_state)
        s = _config.load(config)
        s.update({k: v for k, v in given.items() if v is not None})
        lr = s.get("lr", 1e-3)
        betas = tuple(s.get("betas", (0.9, 0.999)))
        eps = s.get("eps", 1e-8)
        weight_decay = s.get("weight_decay", 0.01)
        if not (isinstance(lr, (int, float)) and lr >= 0 and math.isfinite(lr)):
            raise ValueError(f"lr must be a finite number >= 0, not {lr!r}")
        if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"betas must be two numbers in [0, 1), not {betas!r}")
        optimizer_state = s.get("optimizer_state", "fp32")
        if optimizer_state not in ("fp32", "8bit"):
            raise ValueError(f"optimizer_state must be \"fp32\" or \"8bit\", not {optimizer_state!r}")
        mode = s.get("mode", "zenflow")
        if mode not in _MODES:
            raise ValueError(f"mode must be \"zenflow\" or \"zero_offload\", not {mode!r}")
        # None: the daemon's default (int8 for zenflow, bf16 for zero_offload).
        wire = s.get("wire")
        if wire is not None and wire not in _WIRES:
            raise ValueError(f"wire must be \"fp32\", \"bf16\", \"fp16\" or \"int8\", not {wire!r}")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)
        for g in self.param_groups[1:]:
            for key in ("betas", "eps", "weight_decay"):
                if g[key] != self.param_groups[0][key]:
                    raise ValueError(
                        f"param group {self.param_groups.index(g)} has its own {key}: zenflowd "
                        "runs one AdamW configuration per job")

        self._keep_job = s.get("keep_job", False)
        if not isinstance(self._keep_job, bool):
            raise ValueError(f"keep_job must be True or False, not {self._keep_job!r}")
        daemon_wait = s.get("daemon_wait", DEFAULT_DAEMON_WAIT)
        if (isinstance(daemon_wait, bool) or not isinstance(daemon_wait, (int, float))
                or not 0 <= daemon_wait < math.inf):
            raise ValueError(f"daemon_wait must be seconds >= 0, not {daemon_wait!r}")
        # What close() did to the job: {"ranks_finished", "deleted", "kept"}.
        self.job_end = None
        self._rank = _first(rank, _env_int("RANK", "LOCAL_RANK"), 0)
        self._world = _first(world_size, _env_int("WORLD_SIZE"), 1)
        if not 0 <= self._rank < self._world:
            raise ValueError(f"rank {self._rank} is not in [0, world_size={self._world})")

        self._params = [p for g in self.param_groups for p in g["params"]]
        self._grads = []
        # The engine reads fp32 gradients: a 16-bit parameter's gradient
        # (p.grad, in its dtype, as autograd makes it) is converted into its
        # fp32 buffer at each step.
        self._grads32 = []
        tensors = []
        for i, p in enumerate(self._params):
            if p.dtype not in _PARAM_DTYPES:
                raise TypeError(f"parameter {i} is {p.dtype}: the engine updates float32, "
                                "bfloat16 and float16 parameters (16-bit ones with fp32 "
                                "masters); convert the model first (model.float())")
            # Placement (host or one CUDA device), contiguity and the rest are
            # the extension's to check, the same for every framework.
            g = torch.zeros_like(p, memory_format=torch.contiguous_format)
            if p.grad is not None:
                g.copy_(p.grad)
            p.grad = g
            self._grads.append(g)
            g32 = g if p.dtype == torch.float32 else torch.zeros(p.shape, dtype=torch.float32,
                                                                 device=p.device)
            self._grads32.append(g32)
            tensors.append((f"p{i}", _job_shape(p), _array(p.data), _array(g32),
                            _PARAM_DTYPES[p.dtype]))
        self._device = self._params[0].device if self._params else torch.device("cpu")

        delay = s.get("apply_delay", "adaptive")
        if delay == "sync":
            apply = {"sync": True}
        elif delay == "adaptive":
            apply = {"adaptive": True}
        elif delay == "overlap_step":
            apply = {"overlapStep": True}
        elif isinstance(delay, int) and not isinstance(delay, bool) and delay >= 1:
            apply = {"steps": delay}
        else:
            raise ValueError(f"apply_delay must be \"sync\", \"adaptive\", \"overlap_step\" or "
                             f"steps >= 1, not {delay!r}")
        zen = {"applyDelay": apply}
        for key, proto in (("topk_ratio", "topkRatio"), ("update_interval", "updateInterval"),
                           ("select_interval", "selectInterval"),
                           ("full_warm_up_rounds", "fullWarmupRounds")):
            if key in s:
                zen[proto] = s[key]
        if "predicted_step" in s:
            if not isinstance(s["predicted_step"], bool):
                raise ValueError(f"predicted_step must be True or False, not {s['predicted_step']!r}")
            zen["predictedStep"] = s["predicted_step"]
        for key, proto in (("scale_round_step", "scaleRoundStep"), ("local_step", "localStep")):
            if key in s:
                if not isinstance(s[key], bool):
                    raise ValueError(f"{key} must be True or False, not {s[key]!r}")
                zen[proto] = s[key]
        if "fidelity_budget" in s:
            b = s["fidelity_budget"]
            if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b):
                raise ValueError(f"fidelity_budget must be a finite number, not {b!r}")
            zen["fidelityBudget"] = float(b)
        if zen.get("updateInterval") == "auto":
            # Rounds of 1..S_max steps (the daemon's default S_max), docs/design.md rule 10.
            del zen["updateInterval"]
            zen["autoUpdateInterval"] = True
        spec = {
            "jobId": s.get("job", "torch"),
            "tensors": [{"name": n, "shape": shape, "dtype": _WIRES[dt]}
                        for n, shape, _, _, dt in tensors],
            "adamw": {"lr": lr, "beta1": betas[0], "beta2": betas[1], "eps": eps,
                      "weightDecay": weight_decay},
            "zenflow": zen,
            "mode": _MODES[mode],
            "worldSize": self._world,
            "wireDtype": _WIRES[wire] if wire is not None else "DTYPE_UNSPECIFIED",
            "rankOrderedSums": bool(s.get("rank_ordered_sums", False)),
            "optimizerState": optimizer_state,
        }
        target = s.get("target") or os.environ.get("ZENFLOW_TARGET", "127.0.0.1:50051")
        if isinstance(target, (list, tuple)):
            if not target or not all(isinstance(t, str) and t for t in target):
                raise ValueError("target: a list of daemons must hold non-empty "
                                 "\"host:port\" strings, got %r" % (target,))
            target = ",".join(target)
        token = s.get("token") or os.environ.get("ZENFLOW_TOKEN", "")
        if not token and self._world > 1:
            raise ValueError("the ranks of one job share its token: pass token= (or the "
                             "zenflowd block's token_file, or set ZENFLOW_TOKEN) on every rank")
        self._worker = _zenflow.Worker(
            json.dumps(spec), self._rank, target, s.get("transport", "grpc"),
            float(daemon_wait), float(connect_timeout),
            int(s.get("threads", 2)), [(n, p, g) for n, _, p, g, _ in tensors],
            stream=self._stream(), token=token, tls_ca=s.get("tls_ca", ""),
            tls_cert=s.get("tls_cert", ""), tls_key=s.get("tls_key", ""),
            tls_server_name=s.get("tls_server_name", ""))
        self._step = 0
        self.spec = json.loads(self._worker.spec_json())

    @torch.no_grad()
    def step(self, closure=None):
        """One optimizer step with the gradients in p.grad and param_groups' lr."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        lrs = {g["lr"] for g in self.param_groups}
        if len(lrs) != 1:
            raise ValueError("param groups have different learning rates: zenflowd applies one "
                             "lr per step to every parameter")
        for p, g in zip(self._params, self._grads):
            if p.grad is None:
                g.zero_()
                p.grad = g
            elif p.grad.data_ptr() != g.data_ptr():
                # backward made a new gradient tensor (zero_grad(set_to_none=True)
                # elsewhere): the engine reads from its own buffer.
                g.copy_(p.grad)
                p.grad = g
        for g, g32 in zip(self._grads, self._grads32):
            if g32 is not g:
                g32.copy_(g)
        self._live().step(self._step, float(lrs.pop()), stream=self._stream())
        self._step += 1
        return loss

    def _stream(self):
        # The stream the caller's work on the parameters is queued on now.
        return _stream(self._params[0]) if self._params else 0

    def _live(self):
        if self._worker is None:
            raise ZenFlowError("FAILED_PRECONDITION", "the optimizer was closed")
        return self._worker

    def zero_grad(self, set_to_none=False):
        """Zeroes the gradients in place (the engine keeps reading the same buffers)."""
        for p, g in zip(self._params, self._grads):
            g.zero_()
            p.grad = g

    def stats(self):
        """The last step's figures and the totals: stall, step time, bytes, rounds;
        and "divergence", the mean update divergence of the rounds the daemon
        measured (docs/design.md rule 14; None until one was)."""
        w = self._live()
        totals = w.totals()
        return {"last_step": w.last_step(), "totals": totals, "divergence": totals["divergence"]}

    def finish(self):
        """Waits for and applies every update still in flight."""
        self._live().finish(stream=self._stream())

    def close(self, keep_job=None):
        """Finishes the outstanding rounds, ends this rank's part in the job, disconnects.

        zenflowd deletes the job once every rank has closed, unless one asked
        to keep it (keep_job=True here or to the constructor: it is then
        checkpointed when zenflowd has --state_dir, and stays until deleted
        or zenflowd --job_idle_ttl_s). A rank that closes early leaves the
        job to the ranks still training. If finishing fails, the job is not
        ended (zenflowd's --job_idle_ttl_s does). job_end says what happened.
        """
        if self._worker is None:
            return
        keep = self._keep_job if keep_job is None else keep_job
        if not isinstance(keep, bool):
            raise ValueError(f"keep_job must be True or False, not {keep!r}")
        try:
            self._worker.finish(stream=self._stream())
            self.job_end = self._worker.end_job(keep)
        finally:
            self._worker.close()
            self._worker = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _geometry(self, i):
        shape = _job_shape(self._params[i])
        return (1, shape[0]) if len(shape) == 1 else (shape[0], shape[1])

    def state_dict(self):
        """The optimizer's state, torch-style: per parameter index, exp_avg and
        exp_avg_sq shaped like the parameter and update_counts (one per column:
        AdamW's bias-correction step of each column). The daemon's columns are
        read through its GetState call, the important ones from the engine.

        Applies the rounds in flight first (earlier than their apply delay):
        call it at a round boundary (a step count that is a multiple of
        update_interval) or after finish(); training may go on.
        """
        w = self._live()
        w.drain(stream=self._stream())
        local = {d["tensor"]: d for d in w.local_state(stream=self._stream())}
        state = {}
        version = None
        for i, p in enumerate(self._params):
            name = f"p{i}"
            rows, cols = self._geometry(i)
            m = torch.zeros(cols, rows)
            v = torch.zeros(cols, rows)
            counts = torch.full((cols,), -1, dtype=torch.int64)
            remote = w.get_state(name)
            if version is None:
                version = remote["selection_version"]
            elif remote["selection_version"] != version:
                raise ZenFlowError("ABORTED", "the job reselected its columns while its state "
                                   "was read; call state_dict again")
            for part in (remote, local.get(name)):
                if part is None or len(part["columns"]) == 0:
                    continue
                c = torch.frombuffer(bytearray(part["columns"]), dtype=torch.int32).long()
                m[c] = torch.frombuffer(bytearray(part["m"]), dtype=torch.float32).reshape(-1, rows)
                v[c] = torch.frombuffer(bytearray(part["v"]), dtype=torch.float32).reshape(-1, rows)
                counts[c] = torch.frombuffer(bytearray(part["update_counts"]), dtype=torch.int64)
            if (counts < 0).any():
                missing = (counts < 0).nonzero().flatten()[:5].tolist()
                raise ZenFlowError("INTERNAL", f"no state for columns {missing} of parameter {i}")
            state[i] = {"exp_avg": m.t().contiguous().reshape(p.shape).to(p.device),
                        "exp_avg_sq": v.t().contiguous().reshape(p.shape).to(p.device),
                        "update_counts": counts}
        groups = [{k: g[k] for k in ("lr", "betas", "eps", "weight_decay")}
                  for g in self.param_groups]
        index = {id(p): i for i, p in enumerate(self._params)}
        for g, src in zip(groups, self.param_groups):
            g["params"] = [index[id(p)] for p in src["params"]]
        return {"state": state, "param_groups": groups,
                "zenflow": {"step": self._step, "job": self.spec.get("job_id"),
                            "selection_version": version}}

    def load_state_dict(self, state_dict):
        """Loads a state_dict() into this optimizer before its first step.

        Make the optimizer on a new job (a new `job` id) over the model's
        restored parameters, then load: AdamW's m, v and per-column counts
        continue exactly; the job's rounds and selections start again from
        step 0, and lr comes from param_groups (a scheduler's own state is
        the scheduler's).
        """
        w = self._live()
        if self._step != 0:
            raise ZenFlowError("FAILED_PRECONDITION",
                               "load_state_dict works before the first step only: make a new "
                               "optimizer (on a new job) and load into it")
        if any(p.dtype != torch.float32 for p in self._params):
            raise ZenFlowError("UNIMPLEMENTED",
                               "load_state_dict needs float32 parameters: with 16-bit ones the "
                               "fp32 masters are not in the state_dict yet, so training would "
                               "not continue exactly")
        state = state_dict.get("state")
        if not isinstance(state, dict) or len(state) != len(self._params):
            raise ValueError(f"the state_dict has state for {len(state or {})} parameters; this "
                             f"optimizer has {len(self._params)}")
        if w.local_state(stream=self._stream()):  # before the first selection every column is the daemon's
            raise ZenFlowError("INTERNAL", "the engine updates columns before its first step")
        for i, p in enumerate(self._params):
            s = state.get(i)
            if s is None or not {"exp_avg", "exp_avg_sq", "update_counts"} <= set(s):
                raise ValueError(f"parameter {i}: the state needs exp_avg, exp_avg_sq and "
                                 "update_counts")
            rows, cols = self._geometry(i)
            if s["exp_avg"].shape != p.shape or s["exp_avg_sq"].shape != p.shape or \
                    s["update_counts"].shape != (cols,):
                raise ValueError(f"parameter {i}: the state's shapes do not fit {tuple(p.shape)}")
            colmajor = lambda x: (x.detach().to("cpu", torch.float32).reshape(rows, cols).t()
                                  .contiguous())
            part = {"tensor": f"p{i}",
                    "columns": torch.arange(cols, dtype=torch.int32).numpy().tobytes(),
                    "values": colmajor(p).numpy().tobytes(),
                    "m": colmajor(s["exp_avg"]).numpy().tobytes(),
                    "v": colmajor(s["exp_avg_sq"]).numpy().tobytes(),
                    "update_counts": s["update_counts"].to(torch.int64).contiguous().numpy().tobytes()}
            w.set_state(part)
        for g, src in zip(self.param_groups, state_dict.get("param_groups", [])):
            if "lr" in src:
                g["lr"] = src["lr"]


__all__ = ["ZenFlowOptimizer", "ZenFlowError"]
