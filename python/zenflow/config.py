"""DeepSpeed-style configuration for zenflow.torch.ZenFlowOptimizer.

A configuration is a dict, or the path of a JSON file, written as for
DeepSpeed. What this package reads of it:

- ``zero_optimization.zenflow`` (or a top-level ``zenflow`` block), DeepSpeed's
  keys: ``topk_ratio``, ``select_strategy`` ("auto" or "step"),
  ``select_interval`` ("auto" or steps), ``update_interval`` ("auto" or steps),
  ``full_warm_up_rounds``, ``overlap_step`` (true: apply delay = S; false:
  sync); and this project's ``scale_round_step`` (true or false, default
  false: a round of S steps takes one step of S x lr, docs/design.md rule 12),
  ``local_step`` (true or false, default false: the ranks step the daemon's
  columns between rounds, rule 13) and ``fidelity_budget`` (a number: the
  update divergence update_interval auto keeps under; 0 or below: no limit),
  which the ``zenflowd`` block takes too.
- ``optimizer.params``: ``lr``, ``betas``, ``eps``, ``weight_decay`` ("auto"
  means: the optimizer's own argument).
- ``zenflowd``, this project's own keys: ``target``, ``job``, ``transport``
  ("grpc" or "ucx"), ``wire_dtype`` ("fp32", "bf16", "fp16", "int8"),
  ``apply_delay`` ("sync", "adaptive" or steps; overrides overlap_step),
  ``predicted_step`` (true or false, default true: the predicted step, docs/engine.md),
  ``mode`` ("zenflow" or "zero_offload"), ``daemon_wait_s`` (default 300),
  ``keep_job`` (true or false, default false: the job is deleted when every
  rank has closed), ``rank_ordered_sums``, ``optimizer_state`` ("fp32", the default, or
  "8bit": m and v kept in 8 bits on the daemon), ``threads``, ``token_file`` (a file whose first line
  is the job's token; read here into the ``token`` setting), ``tls_ca``,
  ``tls_cert``, ``tls_key``, ``tls_server_name`` (TLS to zenflowd).

Other DeepSpeed blocks (fp16, scheduler, train_batch_size, ...) are left to
whoever reads them. Unknown keys in the three blocks above raise ValueError
naming the key.
"""

import json
import os

ZENFLOW_KEYS = {
    "topk_ratio",
    "select_strategy",
    "select_interval",
    "update_interval",
    "full_warm_up_rounds",
    "overlap_step",
    "scale_round_step",
    "local_step",
    "fidelity_budget",
}
# The options of rules 12 and 13 and fidelity_budget: in either block
# (zenflowd's wins), passed on as given (ZenFlowOptimizer checks their types).
RULE_KEYS = ("scale_round_step", "local_step", "fidelity_budget")
OPTIMIZER_PARAM_KEYS = {"lr", "betas", "eps", "weight_decay"}
ZENFLOWD_KEYS = {
    "target",
    "job",
    "transport",
    "wire_dtype",
    "apply_delay",
    "predicted_step",
    "scale_round_step",
    "local_step",
    "fidelity_budget",
    "mode",
    "daemon_wait_s",
    "keep_job",
    "rank_ordered_sums",
    "optimizer_state",
    "threads",
    "token_file",
    "tls_ca",
    "tls_cert",
    "tls_key",
    "tls_server_name",
}


def _check_keys(block, allowed, where):
    if not isinstance(block, dict):
        raise ValueError(f"config: {where} must be a JSON object, not {type(block).__name__}")
    for key in block:
        if key not in allowed:
            raise ValueError(
                f"config: unknown key '{key}' in {where} (known: {', '.join(sorted(allowed))})")


def _positive_int(value, key, allow_auto=True):
    if allow_auto and value == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        want = '"auto" or an integer >= 1' if allow_auto else "an integer >= 1"
        raise ValueError(f"config: {key} must be {want}, not {value!r}")
    return value


def load(config):
    """Reads a config (dict, JSON file path, or None) into a flat dict of settings.

    Keys of the result: the optimizer's keyword names (topk_ratio,
    update_interval, select_interval, full_warm_up_rounds, apply_delay, lr,
    betas, eps, weight_decay, predicted_step, scale_round_step, local_step,
    fidelity_budget, target, job, transport, wire, mode,
    daemon_wait, keep_job, rank_ordered_sums, optimizer_state, threads, token, tls_ca,
    tls_cert, tls_key, tls_server_name); only those the config sets.
    """
    if config is None:
        return {}
    if isinstance(config, (str, os.PathLike)):
        with open(config, encoding="utf-8") as f:
            try:
                config = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"config: {os.fspath(config)} is not JSON: {e}") from None
    if not isinstance(config, dict):
        raise ValueError("config: a dict or the path of a JSON file")
    out = {}
    zen = None
    if "zero_optimization" in config:
        zero = config["zero_optimization"]
        if not isinstance(zero, dict):
            raise ValueError("config: zero_optimization must be a JSON object")
        zen = zero.get("zenflow")
        where = "zero_optimization.zenflow"
    if zen is None and "zenflow" in config:
        zen = config["zenflow"]
        where = "zenflow"
    if zen is not None:
        _check_keys(zen, ZENFLOW_KEYS, where)
        if "topk_ratio" in zen:
            k = zen["topk_ratio"]
            if isinstance(k, bool) or not isinstance(k, (int, float)) or not 0 <= k <= 1:
                raise ValueError(f"config: topk_ratio must be a number in [0, 1], not {k!r}")
            out["topk_ratio"] = float(k)
        if "select_strategy" in zen and zen["select_strategy"] not in ("auto", "step"):
            raise ValueError(
                f"config: select_strategy {zen['select_strategy']!r} is not supported "
                "(zenflowd selects by step: \"auto\" or \"step\")")
        for key in ("update_interval", "select_interval"):
            if key in zen:
                v = _positive_int(zen[key], key)
                if v is not None:
                    out[key] = v
                elif key == "update_interval":
                    # "auto": each round's length chosen from the daemon's
                    # measured round time, up to the daemon's default S_max.
                    out[key] = "auto"
        if "full_warm_up_rounds" in zen:
            v = zen["full_warm_up_rounds"]
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"config: full_warm_up_rounds must be an integer >= 0, not {v!r}")
            out["full_warm_up_rounds"] = v
        if "overlap_step" in zen:
            if not isinstance(zen["overlap_step"], bool):
                raise ValueError("config: overlap_step must be true or false")
            out["apply_delay"] = "overlap_step" if zen["overlap_step"] else "sync"
        for key in RULE_KEYS:
            if key in zen:
                out[key] = zen[key]
    opt = config.get("optimizer")
    if isinstance(opt, dict) and "params" in opt:
        params = opt["params"]
        _check_keys(params, OPTIMIZER_PARAM_KEYS, "optimizer.params")
        for key in OPTIMIZER_PARAM_KEYS:
            if key in params and params[key] != "auto":
                out[key] = tuple(params[key]) if key == "betas" else params[key]
    if "zenflowd" in config:
        own = config["zenflowd"]
        _check_keys(own, ZENFLOWD_KEYS, "zenflowd")
        for key, value in own.items():
            if key == "token_file":
                with open(value, encoding="utf-8") as f:
                    token = f.readline().strip()
                if not token:
                    raise ValueError(f"config: zenflowd.token_file {value} is empty")
                out["token"] = token
                continue
            name = {"wire_dtype": "wire", "daemon_wait_s": "daemon_wait"}.get(key, key)
            out[name] = value
    return out
