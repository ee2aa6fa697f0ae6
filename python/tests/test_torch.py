"""zenflow.torch.ZenFlowOptimizer against a real zenflowd on loopback.

Run by `./zf test` (tests:python_test) or `./zf python -m pytest python/tests`.
ZENFLOWD names the daemon binary.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

import pytest
import torch

import zenflow
import zenflow.config
import zenflow.torch
from array_helpers import serve as _serve


@pytest.fixture(scope="module")
def daemon():
    yield from _serve()


@pytest.fixture(scope="module")
def daemon2():
    yield from _serve()


def model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(8, 12, generator=g), torch.randn(8, 4, generator=g)


def loss_of(m, step):
    x, y = batch(step)
    return torch.nn.functional.mse_loss(m(x), y)


def run(m, opt, steps, sched=None):
    losses = []
    for t in range(steps):
        opt.zero_grad()
        loss = loss_of(m, t)
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
        losses.append(loss.item())
    return losses


def train_on_four_batches(m, opt, steps):
    """`steps` steps cycling through batches 0..3 (the loss on batch 0 must fall)."""
    for t in range(steps):
        opt.zero_grad()
        loss_of(m, t % 4).backward()
        opt.step()


def max_diff(a, b):
    return max((x - y).abs().max().item() for x, y in zip(a.parameters(), b.parameters()))


def test_zero_offload_fp32_equals_torch_adamw(daemon):
    ref, got = model(), model()
    torch_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.01)
    with zenflow.torch.ZenFlowOptimizer(got.parameters(), target=daemon, job="zo_fp32",
                                        lr=1e-2, weight_decay=0.01, mode="zero_offload",
                                        wire="fp32") as opt:
        run(got, opt, 12)
        totals = opt.stats()["totals"]
    run(ref, torch_opt, 12)
    # The daemon's AdamW is the reference algorithm in fp32; torch's differs
    # in rounding only.
    assert max_diff(ref, got) < 1e-5
    assert totals["steps"] == 12
    assert totals["bytes_sent"] > 0


def test_zero_offload_bf16_equals_torch_adamw_on_bf16_rounded_gradients(daemon):
    ref, got = model(), model()
    torch_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    with zenflow.torch.ZenFlowOptimizer(got.parameters(), target=daemon, job="zo_bf16",
                                        lr=1e-2, mode="zero_offload", wire="bf16") as opt:
        run(got, opt, 6)
    # The wire rounds each gradient to bf16 (to nearest even); the daemon's
    # AdamW then runs in fp32 on it.
    for t in range(6):
        torch_opt.zero_grad()
        loss_of(ref, t).backward()
        for p in ref.parameters():
            p.grad = p.grad.to(torch.bfloat16).to(torch.float32)
        torch_opt.step()
    assert max_diff(ref, got) < 1e-5
    # And it is not the fp32 run: the rounding shows.
    plain = model()
    run(plain, torch.optim.AdamW(plain.parameters(), lr=1e-2), 6)
    assert max_diff(plain, got) > 1e-5


def test_bf16_parameters_keep_fp32_masters_in_the_daemon(daemon):
    # zero_offload over a bf16 model: the daemon keeps fp32 masters of the
    # bf16 values, runs AdamW in fp32 on the gradients autograd made (bf16,
    # converted to fp32 exactly) and sends back bf16 values, the masters
    # rounded to nearest even. The reference does that with torch's AdamW on
    # fp32 masters, in lockstep with its own bf16 model.
    got = model().to(torch.bfloat16)
    ref = model().to(torch.bfloat16)
    masters = [p.detach().to(torch.float32).clone().requires_grad_(True)
               for p in ref.parameters()]
    torch_opt = torch.optim.AdamW(masters, lr=1e-2)
    with zenflow.torch.ZenFlowOptimizer(got.parameters(), target=daemon, job="zo_bf16_params",
                                        lr=1e-2, mode="zero_offload", wire="fp32") as opt:
        assert opt.spec["tensors"][0]["dtype"] == "DTYPE_BF16"
        for t in range(6):
            opt.zero_grad()
            x, y = batch(t)
            torch.nn.functional.mse_loss(got(x.to(torch.bfloat16)).float(), y).backward()
            assert next(got.parameters()).grad.dtype == torch.bfloat16
            opt.step()
        with pytest.raises(zenflow.ZenFlowError) as e:
            opt.load_state_dict(opt.state_dict())
        assert e.value.code in ("UNIMPLEMENTED", "FAILED_PRECONDITION")
    for t in range(6):
        torch_opt.zero_grad()
        for p in ref.parameters():
            p.grad = None
        x, y = batch(t)
        torch.nn.functional.mse_loss(ref(x.to(torch.bfloat16)).float(), y).backward()
        for mp, p in zip(masters, ref.parameters()):
            mp.grad = p.grad.to(torch.float32)
        torch_opt.step()
        with torch.no_grad():
            for mp, p in zip(masters, ref.parameters()):
                p.copy_(mp.to(torch.bfloat16))
    for a, b in zip(got.parameters(), ref.parameters()):
        assert a.dtype == torch.bfloat16
        # Equal but for rounding: one bf16 step of the value at most.
        tol = 2.0 ** -7 * b.detach().float().abs().clamp(min=1e-3)
        assert ((a.detach().float() - b.detach().float()).abs() <= tol).all()
    # And the updates landed: the parameters moved from the start.
    start = model().to(torch.bfloat16)
    assert max_diff(start, got) > 1e-3


def test_lr_scheduler_is_followed(daemon):
    ref, got = model(), model()
    torch_opt = torch.optim.AdamW(ref.parameters(), lr=2e-2)
    ref_sched = torch.optim.lr_scheduler.StepLR(torch_opt, step_size=3, gamma=0.1)
    with zenflow.torch.ZenFlowOptimizer(got.parameters(), target=daemon, job="sched", lr=2e-2,
                                        mode="zero_offload", wire="fp32") as opt:
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.1)
        run(got, opt, 9, sched)
        assert opt.param_groups[0]["lr"] == pytest.approx(2e-5)
    run(ref, torch_opt, 9, ref_sched)
    assert max_diff(ref, got) < 1e-5


def test_zenflow_mode_trains_and_reports_stats(daemon):
    m = model()
    cfg = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"},
                                 "zenflow": {"topk_ratio": 0.25, "select_strategy": "auto",
                                             "select_interval": "auto", "update_interval": 2,
                                             "full_warm_up_rounds": 0, "overlap_step": True}},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "betas": "auto"}},
           "train_batch_size": 8}
    with zenflow.torch.ZenFlowOptimizer(m.parameters(), target=daemon, job="zen",
                                        config=cfg) as opt:
        assert opt.spec["zenflow"]["update_interval"] == 2
        assert opt.spec["zenflow"]["apply_delay"] == {"steps": 2}  # overlap_step: d = S
        assert opt.spec["zenflow"]["topk_ratio"] == pytest.approx(0.25)
        first = loss_of(m, 0).item()
        train_on_four_batches(m, opt, 40)
        s = opt.stats()
    assert s["totals"]["steps"] == 40
    assert s["totals"]["rounds_applied"] >= 19
    assert s["last_step"]["step"] == 39
    # Rounds of two steps: the daemon measured how far they are from
    # per-step AdamW (docs/design.md rule 14).
    assert s["divergence"] is not None and s["divergence"] > 0
    assert s["divergence"] == s["totals"]["divergence"]
    assert loss_of(m, 0).item() < first


def test_update_interval_auto_trains_with_rounds_of_changing_length(daemon):
    m = model()
    with zenflow.torch.ZenFlowOptimizer(m.parameters(), target=daemon, job="zen-auto", lr=1e-2,
                                        topk_ratio=0.25, update_interval="auto",
                                        select_interval=8) as opt:
        assert opt.spec["zenflow"]["auto_update_interval"] is True
        assert opt.spec["zenflow"]["update_interval"] == 4  # S_max, the daemon's default
        first = loss_of(m, 0).item()
        train_on_four_batches(m, opt, 24)
        s = opt.stats()
    assert s["totals"]["steps"] == 24
    assert 1 <= s["last_step"]["update_interval"] <= 4
    assert loss_of(m, 0).item() < first


def test_defaults_are_auto_with_the_predicted_step_which_a_keyword_turns_off(daemon):
    m = model()
    with zenflow.torch.ZenFlowOptimizer(m.parameters(), target=daemon, job="zen-defaults",
                                        lr=1e-2, topk_ratio=0.25) as opt:
        assert opt.spec["zenflow"]["auto_update_interval"] is True
        assert opt.spec["zenflow"]["predicted_step"] is True
        first = loss_of(m, 0).item()
        train_on_four_batches(m, opt, 12)
        s = opt.stats()
    assert s["totals"]["steps"] == 12
    assert loss_of(m, 0).item() < first
    m = model()
    with zenflow.torch.ZenFlowOptimizer(m.parameters(), target=daemon, job="zen-unpredicted",
                                        lr=1e-2, update_interval=1,
                                        config={"zenflowd": {"predicted_step": False}}) as opt:
        assert opt.spec["zenflow"].get("predicted_step", False) is False
        train_on_four_batches(m, opt, 4)
    with pytest.raises(ValueError, match="predicted_step must be True or False"):
        zenflow.torch.ZenFlowOptimizer(model().parameters(), target=daemon, job="zen-bad",
                                       predicted_step="yes")


def test_rule_options_reach_the_job_spec_from_keywords_and_config(daemon):
    m = model()
    with zenflow.torch.ZenFlowOptimizer(m.parameters(), target=daemon, job="zen-rules-default",
                                        lr=1e-2, topk_ratio=0.25) as opt:
        z = opt.spec["zenflow"]
        # Both off by default (docs/design.md rules 12 and 13).
        assert z.get("scale_round_step", False) is False and z.get("local_step", False) is False
        assert z["fidelity_budget"] == pytest.approx(0.8)  # the daemon's default
        train_on_four_batches(m, opt, 4)
    with zenflow.torch.ZenFlowOptimizer(model().parameters(), target=daemon, job="zen-rules-kw",
                                        update_interval=4, scale_round_step=False,
                                        local_step=False, fidelity_budget=0.25) as opt:
        z = opt.spec["zenflow"]
        assert z.get("scale_round_step", False) is False
        assert z.get("local_step", False) is False
        assert z["fidelity_budget"] == pytest.approx(0.25)
    # DeepSpeed-style keys, in the zenflow block or the zenflowd block; a
    # keyword wins over the config.
    with zenflow.torch.ZenFlowOptimizer(
            model().parameters(), target=daemon, job="zen-rules-config", update_interval=4,
            local_step=True,
            config={"zenflow": {"scale_round_step": False, "local_step": False},
                    "zenflowd": {"fidelity_budget": 0.5}}) as opt:
        z = opt.spec["zenflow"]
        assert z.get("scale_round_step", False) is False
        assert z["local_step"] is True
        assert z["fidelity_budget"] == pytest.approx(0.5)
    assert zenflow.config.load({"zenflowd": {"scale_round_step": False}}) == {
        "scale_round_step": False}
    with pytest.raises(ValueError, match="local_step must be True or False"):
        zenflow.torch.ZenFlowOptimizer(model().parameters(), target=daemon, job="zen-bad",
                                       local_step="yes")
    with pytest.raises(ValueError, match="fidelity_budget must be a finite number"):
        zenflow.torch.ZenFlowOptimizer(model().parameters(), target=daemon, job="zen-bad",
                                       fidelity_budget=float("nan"))


def test_optimizer_state_8bit_from_the_keyword_or_the_config_trains(daemon):
    # zero_offload: every column's update runs on the daemon, whose 16 x 12
    # weight keeps 8-bit m and v (the 4 x 16 one, under 16 rows, fp32).
    m = model()
    before = loss_of(m, 0).item()
    with zenflow.torch.ZenFlowOptimizer(m.parameters(), target=daemon, job="zen-8bit", lr=1e-2,
                                        mode="zero_offload", optimizer_state="8bit") as opt:
        assert opt.spec["optimizer_state"] == "8bit"
        train_on_four_batches(m, opt, 8)
    assert loss_of(m, 0).item() < before
    with zenflow.torch.ZenFlowOptimizer(model().parameters(), target=daemon, job="zen-8bit-cfg",
                                        config={"zenflowd": {"optimizer_state": "8bit"}}) as opt:
        assert opt.spec["optimizer_state"] == "8bit"
    with zenflow.torch.ZenFlowOptimizer(model().parameters(), target=daemon,
                                        job="zen-8bit-default") as opt:
        assert opt.spec["optimizer_state"] == "fp32"
    with pytest.raises(ValueError, match="optimizer_state must be"):
        zenflow.torch.ZenFlowOptimizer(model().parameters(), target=daemon, job="zen-bad",
                                       optimizer_state="int8")


def test_config_file_and_unknown_keys():
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"zenflow": {"topk_ratio": 0.1, "update_interval": "auto"},
                   "zenflowd": {"wire_dtype": "int8", "apply_delay": 2}}, f)
    assert zenflow.config.load(f.name) == {"topk_ratio": 0.1, "update_interval": "auto",
                                           "wire": "int8", "apply_delay": 2}
    with pytest.raises(ValueError, match="unknown key 'topk' in zero_optimization.zenflow"):
        zenflow.config.load({"zero_optimization": {"zenflow": {"topk": 0.1}}})
    with pytest.raises(ValueError, match="unknown key 'port' in zenflowd"):
        zenflow.config.load({"zenflowd": {"port": 1}})
    with pytest.raises(ValueError, match="update_interval must be"):
        zenflow.config.load({"zenflow": {"update_interval": 0}})
    with pytest.raises(ValueError, match="select_strategy"):
        zenflow.config.load({"zenflow": {"select_strategy": "random"}})


def test_bad_arguments_are_refused_before_any_call(daemon):
    m = model()
    with pytest.raises(ValueError, match="mode must be"):
        zenflow.torch.ZenFlowOptimizer(m.parameters(), target=daemon, mode="offload")
    with pytest.raises(ValueError, match="wire must be"):
        zenflow.torch.ZenFlowOptimizer(m.parameters(), target=daemon, wire="fp8")
    with pytest.raises(TypeError, match="float32"):
        zenflow.torch.ZenFlowOptimizer(model().double().parameters(), target=daemon)
    with pytest.raises(ValueError, match="rank 2 is not in"):
        zenflow.torch.ZenFlowOptimizer(m.parameters(), target=daemon, rank=2, world_size=2)


def test_daemon_errors_arrive_as_zenflow_errors(daemon):
    # No daemon at that address: UNAVAILABLE after the connect timeout.
    with pytest.raises(zenflow.ZenFlowError) as e:
        zenflow.torch.ZenFlowOptimizer(model().parameters(), target="127.0.0.1:1",
                                       connect_timeout=1.0)
    assert e.value.code == "UNAVAILABLE"
    assert "nothing listens at 127.0.0.1:1 yet (connection refused)" in e.value.message
    # A URL instead of HOST:PORT: at once, naming the form.
    with pytest.raises(zenflow.ZenFlowError) as e:
        zenflow.torch.ZenFlowOptimizer(model().parameters(), target="http://127.0.0.1:1")
    assert e.value.code == "INVALID_ARGUMENT"
    assert "want HOST:PORT" in e.value.message
    # A setting the daemon refuses: INVALID_ARGUMENT with its message.
    with pytest.raises(zenflow.ZenFlowError) as e:
        zenflow.torch.ZenFlowOptimizer(model().parameters(), target=daemon, job="bad",
                                       update_interval=4, select_interval=6)
    assert e.value.code == "INVALID_ARGUMENT"
    assert "select_interval" in e.value.message
    # The daemon is still fine: the next good job runs.
    m = model()
    with zenflow.torch.ZenFlowOptimizer(m.parameters(), target=daemon, job="after_bad",
                                        mode="zero_offload", wire="fp32") as opt:
        run(m, opt, 2)
    with pytest.raises(zenflow.ZenFlowError) as e:
        opt.step()
    assert e.value.code == "FAILED_PRECONDITION"


def sim_tensors(m):
    out = []
    for i, p in enumerate(m.parameters()):
        w = p.detach().reshape(-1).tolist()
        if p.dim() == 1:
            out.append((f"p{i}", 1, p.shape[0], True, w))
        else:
            out.append((f"p{i}", p.shape[0], p.numel() // p.shape[0], False, w))
    return out


@pytest.mark.parametrize("delay", ["sync", 1])
def test_zenflow_equals_the_reference_simulator_step_by_step(daemon, delay):
    """The project's independent simulation of the rules (tests/testing/zenflow_sim.h),
    fed the same gradients, holds the same parameters after every step, across
    reselections (R = 8) and with warm-up rounds."""
    if os.environ.get("ZF_REQUIRE_SIM"):  # tests:python_test builds it
        import _zenflow_sim
    else:
        _zenflow_sim = pytest.importorskip("_zenflow_sim")
    m = model()
    sim = _zenflow_sim.Sim(dict(S=2, R=8, warmup_rounds=1, delay=0 if delay == "sync" else delay,
                                k=0.25, wd=0.01, scale_round_step=False, local_step=False),
                           sim_tensors(m))
    with zenflow.torch.ZenFlowOptimizer(m.parameters(), target=daemon, job=f"sim_{delay}",
                                        lr=1e-2, weight_decay=0.01, topk_ratio=0.25,
                                        update_interval=2, select_interval=8,
                                        full_warm_up_rounds=1, apply_delay=delay,
                                        wire="fp32",
                                        # (rules 12 and 13: not in the simulator)
                                        scale_round_step=False, local_step=False) as opt:
        for t in range(24):
            opt.zero_grad()
            loss_of(m, t).backward()
            grads = [[p.grad.reshape(-1).tolist() for p in m.parameters()]]
            opt.step()
            sim.step(t, 1e-2, grads)
            for i, p in enumerate(m.parameters()):
                want = torch.tensor(sim.params(i)).reshape(p.shape)
                assert torch.allclose(p.detach(), want, rtol=1e-4, atol=2e-5), \
                    f"step {t}, parameter {i}: max diff {(p.detach() - want).abs().max().item()}"
        assert opt.stats()["totals"]["reselections"] == sim.reselections() > 0


def _rank_main(rank, target, steps, out):
    m = model()
    opt = zenflow.torch.ZenFlowOptimizer(m.parameters(), target=target, job="two_ranks",
                                         rank=rank, world_size=2, lr=1e-2,
                                         mode="zero_offload", wire="fp32")
    for t in range(steps):
        opt.zero_grad()
        x, y = batch(2 * t + rank)  # each rank its own data
        torch.nn.functional.mse_loss(m(x), y).backward()
        opt.step()
    opt.close()
    torch.save([p.detach() for p in m.parameters()], out)


def test_two_processes_equal_torch_adamw_on_the_mean_gradient(daemon, tmp_path):
    steps = 6
    ctx = torch.multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, args=(r, daemon, steps, str(tmp_path / f"r{r}.pt")))
             for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    ref = model()
    torch_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    for t in range(steps):
        torch_opt.zero_grad()
        grads = []
        for r in range(2):
            ref.zero_grad()
            x, y = batch(2 * t + r)
            torch.nn.functional.mse_loss(ref(x), y).backward()
            grads.append([p.grad.clone() for p in ref.parameters()])
        for p, g0, g1 in zip(ref.parameters(), *grads):
            p.grad = (g0 + g1) / 2
        torch_opt.step()
    r0 = torch.load(tmp_path / "r0.pt")
    r1 = torch.load(tmp_path / "r1.pt")
    for a, b, want in zip(r0, r1, ref.parameters()):
        assert torch.equal(a, b), "the ranks must hold the same parameters"
        assert (a - want.detach()).abs().max().item() < 1e-5


def test_a_daemon_killed_mid_run_raises(tmp_path):
    binary = os.environ["ZENFLOWD"]
    port_file = tmp_path / "port"
    # The tests' jobs share one token ($ZENFLOW_TOKEN): let it hold them all.
    proc = subprocess.Popen([binary, "--listen=127.0.0.1:0", f"--port_file={port_file}",
                             "--max_jobs_per_credential=256"],
                            stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            if port_file.exists() and port_file.stat().st_size > 0:
                break
            time.sleep(0.05)
        target = f"127.0.0.1:{port_file.read_text().strip()}"
        m = model()
        # daemon_wait=0: fail at once instead of riding through (default 300 s).
        opt = zenflow.torch.ZenFlowOptimizer(m.parameters(), target=target, job="killed",
                                             mode="zero_offload", wire="fp32", daemon_wait=0)
        run(m, opt, 2)
        proc.kill()
        proc.wait()
        with pytest.raises(zenflow.ZenFlowError) as e:
            run(m, opt, 50)
        assert e.value.code in ("UNAVAILABLE", "CANCELLED"), e.value
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_close_deletes_the_job_and_keep_job_keeps_it(daemon):
    m = model()
    kw = dict(target=daemon, lr=1e-2, mode="zero_offload", wire="fp32")
    with zenflow.torch.ZenFlowOptimizer(m.parameters(), job="ends", **kw) as opt:
        assert opt.job_end is None
        run(m, opt, 2)
    assert opt.job_end == {"ranks_finished": 1, "deleted": True, "kept": False}
    # The name is free: a second run with it starts afresh and ends too.
    with zenflow.torch.ZenFlowOptimizer(m.parameters(), job="ends", **kw) as opt:
        run(m, opt, 2)
    assert opt.job_end["deleted"]
    # keep_job=True (a keyword, or the config's zenflowd.keep_job) keeps it.
    opt = zenflow.torch.ZenFlowOptimizer(m.parameters(), job="kept", keep_job=True, **kw)
    run(m, opt, 2)
    opt.close()
    assert opt.job_end == {"ranks_finished": 1, "deleted": False, "kept": True}
    # A second run with the same name and token is told what holds the id
    # and what to do.
    with pytest.raises(zenflow.ZenFlowError) as e:
        zenflow.torch.ZenFlowOptimizer(m.parameters(), job="kept", **kw)
    assert e.value.code == "ALREADY_EXISTS", e.value
    for want in ("job 'kept' already exists on this daemon: held since", "0 of 1 ranks attached",
                 "zfctl delete kept", "pick another job name"):
        assert want in e.value.message, e.value.message
    cfg = {"zenflowd": {"keep_job": True}}
    opt = zenflow.torch.ZenFlowOptimizer(m.parameters(), job="kept_cfg", config=cfg, **kw)
    run(m, opt, 1)
    opt.close(keep_job=False)  # close's own keyword wins
    assert opt.job_end["deleted"]
    with pytest.raises(ValueError, match="keep_job must be True or False"):
        zenflow.torch.ZenFlowOptimizer(m.parameters(), job="bad", keep_job="yes", **kw)
    with pytest.raises(ValueError, match="daemon_wait must be seconds"):
        zenflow.torch.ZenFlowOptimizer(m.parameters(), job="bad", daemon_wait=-1, **kw)
    assert zenflow.torch.DEFAULT_DAEMON_WAIT == 300.0


def _early_rank_main(rank, target, out):
    # Rank 0 closes right after the last step; rank 1 then still reads the
    # daemon's state (state_dict) and closes a while later.
    m = model()
    opt = zenflow.torch.ZenFlowOptimizer(m.parameters(), target=target, job="early",
                                         rank=rank, world_size=2, lr=1e-2, topk_ratio=0.25,
                                         update_interval=2, apply_delay="sync", wire="fp32")
    for t in range(4):
        opt.zero_grad()
        x, y = batch(2 * t + rank)
        torch.nn.functional.mse_loss(m(x), y).backward()
        opt.step()
    if rank == 0:
        opt.close()
    else:
        opt.finish()
        time.sleep(1.0)  # rank 0 has closed by now
        sd = opt.state_dict()
        assert sd["zenflow"]["step"] == 4
        opt.close()
    with open(out, "w") as f:
        json.dump(opt.job_end, f)


def test_a_rank_that_closes_early_leaves_the_job_to_the_others(daemon, tmp_path):
    ctx = torch.multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_early_rank_main, args=(r, daemon, str(tmp_path / f"r{r}.json")))
             for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    ends = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(2)]
    assert ends[0] == {"ranks_finished": 1, "deleted": False, "kept": False}
    assert ends[1] == {"ranks_finished": 2, "deleted": True, "kept": False}


def test_state_dict_round_trip_continues_exactly(daemon):
    """state_dict at a round boundary, loaded into a new job over the same
    parameters, continues as the original run does."""
    kw = dict(target=daemon, lr=1e-2, topk_ratio=0.25, update_interval=2, select_interval=8,
              apply_delay="sync", wire="fp32")
    a = model()
    opt_a = zenflow.torch.ZenFlowOptimizer(a.parameters(), job="sd_a", **kw)
    for t in range(8):
        opt_a.zero_grad()
        loss_of(a, t).backward()
        opt_a.step()
    sd = opt_a.state_dict()
    assert sd["zenflow"]["step"] == 8
    for i, p in enumerate(a.parameters()):
        s = sd["state"][i]
        assert s["exp_avg"].shape == p.shape and s["exp_avg_sq"].shape == p.shape
        assert (s["exp_avg_sq"] >= 0).all() and s["exp_avg_sq"].abs().sum() > 0
        assert (s["update_counts"] >= 1).all()
    b = model()
    with torch.no_grad():
        for pb, pa in zip(b.parameters(), a.parameters()):
            pb.copy_(pa)
    # Inside a round: refused, and the optimizer goes on.
    opt_a.zero_grad()
    loss_of(a, 8).backward()
    opt_a.step()
    with pytest.raises(zenflow.ZenFlowError) as e:
        opt_a.state_dict()
    assert e.value.code == "FAILED_PRECONDITION" and "round boundary" in e.value.message
    for t in range(9, 16):
        opt_a.zero_grad()
        loss_of(a, t).backward()
        opt_a.step()
    opt_a.close()

    opt_b = zenflow.torch.ZenFlowOptimizer(b.parameters(), job="sd_b", **kw)
    bad = {"state": {i: dict(s) for i, s in sd["state"].items()}}
    bad["state"][0]["exp_avg"] = bad["state"][0]["exp_avg"][:1]
    with pytest.raises(ValueError, match="shapes do not fit"):
        opt_b.load_state_dict(bad)
    opt_b.load_state_dict(sd)
    for t in range(8, 16):
        opt_b.zero_grad()
        loss_of(b, t).backward()
        opt_b.step()
    with pytest.raises(zenflow.ZenFlowError) as e:
        opt_b.load_state_dict(sd)
    assert e.value.code == "FAILED_PRECONDITION"
    opt_b.close()
    assert max_diff(a, b) == 0  # bit-identical


def test_rank_and_world_size_come_from_the_environment(daemon, tmp_path):
    """As torchrun sets them: RANK and WORLD_SIZE (LOCAL_RANK when RANK is unset)."""
    script = tmp_path / "rank.py"
    script.write_text(
        "import os, sys, torch, zenflow.torch\n"
        "torch.manual_seed(0)\n"
        "m = torch.nn.Linear(8, 4)\n"
        "opt = zenflow.torch.ZenFlowOptimizer(m.parameters(), target=sys.argv[1], job='env',\n"
        "                                     lr=1e-2, mode='zero_offload', wire='fp32')\n"
        "for t in range(3):\n"
        "    opt.zero_grad()\n"
        "    g = torch.Generator().manual_seed(10 * t + opt._rank)\n"
        "    m(torch.randn(4, 8, generator=g)).pow(2).mean().backward()\n"
        "    opt.step()\n"
        "opt.close()\n"
        "print(opt._rank, opt._world, opt.spec['world_size'], float(m.weight.sum()))\n")
    procs = []
    for env in ({"RANK": "0", "WORLD_SIZE": "2"}, {"LOCAL_RANK": "1", "WORLD_SIZE": "2"}):
        e = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
        e.update(env)
        procs.append(subprocess.Popen([sys.executable, str(script), daemon], env=e,
                                      stdout=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert [o[:3] for o in outs] == [["0", "2", "2"], ["1", "2", "2"]]
    assert outs[0][3] == outs[1][3]  # the same parameters on both ranks


def test_a_job_is_reached_with_its_token_only(daemon, monkeypatch):
    m = model()
    with zenflow.torch.ZenFlowOptimizer(m.parameters(), target=daemon, job="tok_owned",
                                        token="owner-token-for-python-test") as opt:
        run(m, opt, 2)
        # Another token's run of the same job id is refused, told only that
        # the id is taken (docs/security.md) and what to do; the owner goes on.
        with pytest.raises(zenflow.ZenFlowError) as e:
            zenflow.torch.ZenFlowOptimizer(model().parameters(), target=daemon, job="tok_owned",
                                           token="another-token-for-python-test")
        assert e.value.code == "ALREADY_EXISTS", e.value
        assert "job id 'tok_owned' is taken" in e.value.message
        assert "pick another job name" in e.value.message
        assert "held since" not in e.value.message
        run(m, opt, 2)
    # Ranks of one job share its token: two ranks without one are refused
    # before any call.
    monkeypatch.delenv("ZENFLOW_TOKEN", raising=False)
    with pytest.raises(ValueError, match="share its token"):
        zenflow.torch.ZenFlowOptimizer(model().parameters(), target=daemon, rank=0, world_size=2)


@pytest.mark.parametrize("mode", ["zenflow", "zero_offload"])
def test_a_job_over_two_daemons_equals_the_job_on_one(daemon, daemon2, mode):
    one, two, init = model(), model(), model()
    kw = dict(lr=1e-2, weight_decay=0.01, mode=mode, wire="fp32")
    if mode == "zenflow":
        kw.update(topk_ratio=0.25, update_interval=2, select_interval=4, apply_delay="sync")
    with zenflow.torch.ZenFlowOptimizer(one.parameters(), target=daemon, job=f"one_{mode}",
                                        **kw) as opt:
        run(one, opt, 12)
    with zenflow.torch.ZenFlowOptimizer(two.parameters(), target=[daemon, daemon2],
                                        job=f"two_{mode}", **kw) as opt:
        run(two, opt, 12)
        spec = opt.spec
    assert spec["partition"]["parts"] == 2
    assert sorted({e.get("part", 0) for e in spec["partition"]["tensors"]}) == [0, 1]
    for a, b in zip(one.parameters(), two.parameters()):
        assert torch.equal(a, b)
    assert max_diff(one, init) > 1e-3
    with pytest.raises(ValueError, match="non-empty"):
        zenflow.torch.ZenFlowOptimizer(model().parameters(), target=[daemon, ""], job="bad")
