// stall_bench: how much of the CPU optimizer's time the GPU would wait for,
// zero_offload against zenflow, through the real worker engine
// (ZenFlowOptimizer on the CPU backend) and a real zenflowd.
//
// Device time is EMULATED: every step sleeps --device_ms to stand for the
// forward and backward pass on a GPU, leaving the CPU free for the daemon as
// it would be beside a real GPU. The engine's own device kernels (importance,
// top-k, the important columns' AdamW, pack, apply) do run, on the CPU
// backend with --threads threads: unlike on a GPU they take CPU time from the
// daemon, and the JSON's step_breakdown_ms reports them. Gradients are SYNTHETIC: one fixed random
// buffer per tensor, generated once before the first mode and reused as the
// gradient of every step (per-step scalar 1), so producing them costs no CPU
// during the measured steps. The model is --params parameters split over
// --tensors 2-D tensors [4096, params/4096/tensors] plus one 1-D tensor of
// 4096 values.
//
// The modes run one after another in this process, against the same daemon,
// each as its own job (deleted afterwards): zero_offload (every column on the
// daemon, S = 1, sync) and zenflow (k = --topk, S = --interval, adaptive
// apply delay), zero_offload with a bf16 gradient wire and zenflow with the
// daemon's default (int8) or --zenflow_wire, both over the same --transport
// (default ucx). Per mode: mean step time (emulated device time + Step()),
// stall per step (time Step() blocked waiting for deltas) and wire bytes per
// step (data stream up + down, as the engine counts them between steps).
// Warm-up, left out of the averages, is every step up to the one that
// applies the first round's update:
// zero_offload's step 0, zenflow's first 2S steps (round 0 closes at step
// S-1 and, before any round time is measured, is applied S steps later). So
// both modes' warm-ups hold the daemon's first round, which pays one-time
// costs (first touch of its 20 B/param of state). Finish() (the drain of the
// last rounds) is reported separately, not in the step mean.
//
//   stall_bench --target=127.0.0.1:50051 [--device_ms=60] [--params=104857600]
//               [--steps=24] [--out=bench-results/stall.json]
// tools/bench_stall.sh builds it, starts zenflowd and runs it.
//
// --device chooses where the engine's kernels run:
//   cpu       the CPU backend (--threads): real kernels, on the cores the
//             daemon needs (step_breakdown_ms shows their cost);
//   cuda      GPU 0;
//   emulated  an EMULATED GPU (gpu_worker/kernels/emulated_backend.h) with
//             the figures of --device_profile (default h100-sxm): every
//             kernel and host<->device copy costs a modelled time on a
//             stream clock and no host arithmetic, so the host does only what
//             it would beside a real GPU (move bytes through the client
//             library, run the daemon). Its results are not numerics. The
//             JSON's "device_profile" names the profile ("none" for cpu and
//             cuda, whose kernels really run) and each mode adds
//             "emulated_device_busy_ms_per_step" (the modelled stream time
//             of Step()) and "pcie_bytes_per_step".
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tools/bench/bench_main.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/tls_flags.h"
#include "common/codec.h"
#include "common/dtype_proto.h"
#include "common/json_writer.h"
#include "common/random.h"
#include "common/status_macros.h"
#include "gpu_worker/backend.h"
#include "gpu_worker/device_buffer.h"
#include "gpu_worker/kernels/emulated_backend.h"
#include "gpu_worker/engine/zenflow_optimizer.h"

ABSL_FLAG(std::string, target, "", "zenflowd address host:port (required)");
ABSL_FLAG(std::string, transport, "ucx",
          "data stream transport of both modes: ucx (shared memory with a local zenflowd) or "
          "grpc");
ABSL_FLAG(std::string, ucx_tls, "sm,self",
          "with --transport=ucx: UCX transports (UCX_TLS syntax); they must overlap the "
          "daemon's --ucx_tls (e.g. tcp,self for a daemon on another host)");
ABSL_FLAG(int, device_ms, 60, "emulated device (forward + backward) time per step, ms");
ABSL_FLAG(std::string, zenflow_wire, "",
          "zenflow mode's gradient wire: bf16 or int8; empty: the daemon's default, int8 "
          "(zero_offload always uses bf16)");
ABSL_FLAG(int64_t, params, 104857600, "parameters in the 2-D tensors (plus a 4096-value 1-D tensor)");
ABSL_FLAG(int, tensors, 4, "2-D tensors the parameters are split over");
ABSL_FLAG(int, steps, 24, "zenflow steps");
ABSL_FLAG(int, zero_offload_steps, -1, "zero_offload steps (-1: the same as --steps)");
ABSL_FLAG(double, topk, 0.1, "zenflow: k, fraction of columns updated on the worker");
ABSL_FLAG(int, interval, 4, "zenflow: update_interval S (S_max with --auto_interval)");
ABSL_FLAG(bool, auto_interval, false,
          "zenflow: update_interval auto (docs/design.md rule 10): each round's S chosen from the "
          "daemon's measured round time, 1..--interval; the JSON's s_mean is their mean");
ABSL_FLAG(int, threads, 1, "worker CPU backend threads (the daemon keeps the other cores)");
ABSL_FLAG(std::string, device, "cpu",
          "where the engine's kernels run: cpu (the CPU backend, --threads), cuda (GPU 0) or "
          "emulated (an EMULATED GPU of --device_profile: modelled kernel and copy times, no "
          "numerics); forward and backward are always the emulated --device_ms");
ABSL_FLAG(std::string, device_profile, "h100-sxm",
          "with --device=emulated: the device's figures (h100-sxm, h100-pcie, a100-sxm-80gb)");
ABSL_FLAG(double, lr, 1e-3, "learning rate (constant)");
ABSL_FLAG(std::string, param_dtype, "bf16",
          "the model's parameter dtype, fp32, bf16 or fp16 (models are fine-tuned in bf16: the "
          "engine keeps fp32 masters of its important columns, the daemon returns values in "
          "this dtype); gradients are fp32");
ABSL_FLAG(int64_t, staging_mb, 32,
          "pinned staging for shards in flight, MiB (EngineOptions::staging_bytes, whose default "
          "is 32; the client's send window is at least as large); -1: one step's shard bytes of "
          "the mode (its remote columns on the wire), so that all of a step's shards can travel "
          "while the device runs the next");
ABSL_FLAG(std::string, job_prefix, "stall-bench", "job ids are <prefix>-<mode>-<pid>");
ABSL_FLAG(std::string, out, "bench-results/stall.json", "JSON result file");

namespace zenflow {
namespace {

constexpr int64_t kRows = 4096;
constexpr int64_t kVector = 4096;  // the 1-D tensor

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Uniform in [-1, 1).
float Uniform(uint64_t* s) {
  return static_cast<float>(static_cast<double>(NextRandom(s) >> 40) * (1.0 / (1ull << 23)) - 1.0);
}

struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  int64_t n = 0;
  worker::DeviceBuffer param, grad;  // param in ParamDType(), grad fp32
};

// --param_dtype: the model's parameter dtype (gradients are fp32).
DType ParamDType() {
  const std::string d = absl::GetFlag(FLAGS_param_dtype);
  return d == "fp32" ? DType::kF32 : d == "fp16" ? DType::kF16 : DType::kBF16;
}

// --zenflow_wire, or when empty the daemon's default for zenflow jobs
// (server/job_spec.cc, docs/design.md rule 5).
std::string ZenflowWire() {
  const std::string w = absl::GetFlag(FLAGS_zenflow_wire);
  return w.empty() ? "int8" : w;
}

// Fills backend memory in chunks through a small host buffer. Gradients get
// a per-column scale (so the column importance is spread out, as in a real
// model); parameters are small uniform values.
absl::Status Fill(worker::Backend* be, Tensor& t, bool grad, uint64_t seed) {
  const int64_t cols = t.shape.back();
  std::vector<float> colscale(cols, 1.0f);
  uint64_t s = seed;
  if (grad) {
    for (int64_t c = 0; c < cols; ++c) colscale[c] = 1e-3f * std::exp(2.0f * Uniform(&s));
  }
  const int64_t chunk = int64_t{1} << 20;
  std::vector<float> host;
  std::vector<char> encoded;
  const DType dtype = grad ? DType::kF32 : ParamDType();
  const size_t esize = DTypeSize(dtype);
  char* dst = static_cast<char*>(grad ? t.grad.p() : t.param.p());
  for (int64_t off = 0; off < t.n; off += chunk) {
    const int64_t len = std::min(chunk, t.n - off);
    host.resize(len);
    for (int64_t i = 0; i < len; ++i) {
      const float u = Uniform(&s);
      host[i] = grad ? colscale[(off + i) % cols] * u : 0.02f * u;
    }
    encoded.resize(len * esize);
    Encode(dtype, host.data(), len, encoded.data());
    ZF_RETURN_IF_ERROR(be->CopyToDevice(dst + off * esize, encoded.data(), len * esize));
  }
  return be->Synchronize();
}

struct ModeResult {
  std::string mode;
  int steps = 0;
  int warmup_steps = 0;
  int measured_steps = 0;
  double mean_step_ms = 0;
  double mean_optimizer_ms = 0;  // Step() alone
  double stall_ms_per_step = 0;
  double send_blocked_ms_per_step = 0;
  // Step() broken down (ms per step): important columns, pack, push, apply.
  double important_ms = 0, pack_ms = 0, push_ms = 0, apply_ms = 0;
  double wire_bytes_per_step = 0;
  double bytes_up_per_step = 0;
  double bytes_down_per_step = 0;
  double min_step_ms = 0, max_step_ms = 0;
  double setup_s = 0;   // create, upload, join
  int64_t staging_bytes = 0;  // EngineOptions::staging_bytes
  // --device=emulated only: modelled stream time and PCIe bytes of Step().
  double emulated_busy_ms = 0;
  double pcie_bytes_per_step = 0;
  double finish_ms = 0;  // drain at the end (not in the step mean)
  int64_t rounds_applied = 0;
  int64_t reselections = 0;
  int32_t interval = 1;
  double s_mean = 0;  // steps per closed round (auto: the S chosen on average)
  // The mean update divergence of the rounds the daemon measured
  // (docs/design.md rule 14); negative: none was.
  double divergence = -1;
};

absl::StatusOr<ModeResult> RunMode(const std::string& mode, int steps, worker::Backend* be,
                                   std::vector<Tensor>& model) {
  ModeResult r;
  r.mode = mode;
  r.steps = steps;
  const bool zo = mode == "zero_offload";
  // Every mode starts from the same initial values.
  for (size_t i = 0; i < model.size(); ++i) {
    ZF_RETURN_IF_ERROR(Fill(be, model[i], /*grad=*/false, 1000 + i));
  }
  std::vector<ParamSpec> specs;
  v1::JobSpec want;
  want.set_job_id(absl::StrCat(absl::GetFlag(FLAGS_job_prefix), "-", mode, "-", getpid()));
  for (Tensor& t : model) {
    ParamSpec ps;
    ps.name = t.name;
    ps.shape = t.shape;
    ps.param = t.param.p();
    ps.dtype = ParamDType();
    ps.grad = t.grad.f32();
    specs.push_back(ps);
    v1::TensorSpec* ts = want.add_tensors();
    ts->set_name(t.name);
    ts->set_dtype(ToProto(ParamDType()));
    ts->mutable_shape()->Add(t.shape.begin(), t.shape.end());
  }
  want.set_world_size(1);
  want.set_mode(zo ? v1::MODE_ZERO_OFFLOAD : v1::MODE_ZENFLOW);
  if (zo) {
    want.set_wire_dtype(v1::DTYPE_BF16);
  } else if (!absl::GetFlag(FLAGS_zenflow_wire).empty()) {
    want.set_wire_dtype(ZenflowWire() == "int8" ? v1::DTYPE_INT8 : v1::DTYPE_BF16);
  }  // else the daemon's default, which ZenflowWire() names
  const float lr = static_cast<float>(absl::GetFlag(FLAGS_lr));
  want.mutable_adamw()->set_lr(lr);
  if (!zo) {
    v1::ZenFlowConfig* z = want.mutable_zenflow();
    z->set_topk_ratio(static_cast<float>(absl::GetFlag(FLAGS_topk)));
    z->set_update_interval(absl::GetFlag(FLAGS_interval));
    z->set_auto_update_interval(absl::GetFlag(FLAGS_auto_interval));
    z->mutable_apply_delay()->set_adaptive(true);
  }

  const double t_setup = Now();
  EngineOptions eo;
  const int64_t staging_mb = absl::GetFlag(FLAGS_staging_mb);
  if (staging_mb >= 0) {
    eo.staging_bytes = static_cast<size_t>(staging_mb) << 20;
  } else {
    const double remote = zo ? 1.0 : 1.0 - absl::GetFlag(FLAGS_topk);
    const double wire = zo || ZenflowWire() != "int8" ? 2.0 : 1.0;
    eo.staging_bytes = static_cast<size_t>(
        remote * wire * static_cast<double>(absl::GetFlag(FLAGS_params)) + (8 << 20));
  }
  r.staging_bytes = static_cast<int64_t>(eo.staging_bytes);
  ClientOptions co;
  co.max_inflight_bytes = std::max<int64_t>(co.max_inflight_bytes, r.staging_bytes);
  co.target = absl::GetFlag(FLAGS_target);
  ApplyTlsFlags(&co);
  ZF_ASSIGN_OR_RETURN(co.transport, ParseTransport(absl::GetFlag(FLAGS_transport)));
  co.ucx.tls = absl::GetFlag(FLAGS_ucx_tls);
  ZF_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Connect(co));
  ZF_ASSIGN_OR_RETURN(v1::JobSpec spec, JoinOrCreateJob(client.get(), want, 0, be, specs));
  ZF_ASSIGN_OR_RETURN(std::unique_ptr<ZenFlowOptimizer> opt,
                      ZenFlowOptimizer::Create(be, client.get(), spec, 0, specs, eo));
  r.setup_s = Now() - t_setup;
  r.interval = zo ? 1 : std::max(1, spec.zenflow().update_interval());
  r.warmup_steps = std::min(steps, zo ? 1 : 2 * r.interval);

  const int device_ms = absl::GetFlag(FLAGS_device_ms);
  double sum_step = 0, sum_opt = 0, sum_stall = 0, sum_blocked = 0;
  double sum_up = 0, sum_down = 0;
  double sum_imp = 0, sum_pack = 0, sum_push = 0, sum_apply = 0;
  double sum_busy = 0, sum_pcie = 0;
  auto* emu = dynamic_cast<worker::EmulatedBackend*>(be);
  r.min_step_ms = 1e300;
  for (int t = 0; t < steps; ++t) {
    const double busy0 = emu != nullptr ? emu->modelled_busy_seconds() : 0;
    const double pcie0 = emu != nullptr ? emu->h2d_bytes() + emu->d2h_bytes() : 0;
    const double t0 = Now();
    // Emulated forward + backward on the device; the gradient buffers
    // already hold this step's (fixed) gradients.
    if (device_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(device_ms));
    const double t1 = Now();
    ZF_RETURN_IF_ERROR(opt->Step(t, lr));
    const double t2 = Now();
    const StepStats& st = opt->last_step();
    const double step_ms = (t2 - t0) * 1e3;
    const double busy_ms = emu != nullptr ? (emu->modelled_busy_seconds() - busy0) * 1e3 : 0;
    const double pcie = emu != nullptr ? emu->h2d_bytes() + emu->d2h_bytes() - pcie0 : 0;
    char busy_note[64] = "";
    if (emu != nullptr) {
      std::snprintf(busy_note, sizeof(busy_note), "  emulated device busy %.1f ms", busy_ms);
    }
    std::fprintf(stderr,
                 "  %-12s step %3d  %8.1f ms  (optimizer %7.1f: pack %6.1f push %6.1f apply %6.1f "
                 "stall %7.1f)  wire %7.1f MiB%s%s\n",
                 mode.c_str(), t, step_ms, (t2 - t1) * 1e3, st.pack_seconds * 1e3,
                 st.push_seconds * 1e3, st.apply_seconds * 1e3, st.stall_seconds * 1e3,
                 static_cast<double>(st.bytes_sent + st.bytes_received) / (1 << 20),
                 busy_note,
                 t < r.warmup_steps ? "  [warm-up]" : "");
    if (t < r.warmup_steps) continue;
    sum_step += step_ms;
    sum_busy += busy_ms;
    sum_pcie += pcie;
    sum_opt += (t2 - t1) * 1e3;
    sum_stall += st.stall_seconds * 1e3;
    sum_blocked += st.send_blocked_seconds * 1e3;
    sum_imp += st.important_seconds * 1e3;
    sum_pack += st.pack_seconds * 1e3;
    sum_push += st.push_seconds * 1e3;
    sum_apply += st.apply_seconds * 1e3;
    sum_up += static_cast<double>(st.bytes_sent);
    sum_down += static_cast<double>(st.bytes_received);
    r.min_step_ms = std::min(r.min_step_ms, step_ms);
    r.max_step_ms = std::max(r.max_step_ms, step_ms);
  }
  const double t_fin = Now();
  ZF_RETURN_IF_ERROR(opt->Finish());
  r.finish_ms = (Now() - t_fin) * 1e3;
  r.rounds_applied = opt->totals().rounds_applied;
  if (opt->totals().rounds_closed > 0) {
    r.s_mean = static_cast<double>(opt->totals().round_steps) /
               static_cast<double>(opt->totals().rounds_closed);
  }
  r.reselections = opt->totals().reselections;
  if (opt->totals().divergence_rounds > 0) {
    r.divergence = opt->totals().divergence_sum / static_cast<double>(opt->totals().divergence_rounds);
  }
  r.measured_steps = steps - r.warmup_steps;
  if (r.measured_steps <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(mode, ": ", steps, " steps leave none after the ",
                                                   r.warmup_steps, "-step warm-up"));
  }
  const double m = r.measured_steps;
  r.mean_step_ms = sum_step / m;
  r.mean_optimizer_ms = sum_opt / m;
  r.stall_ms_per_step = sum_stall / m;
  r.send_blocked_ms_per_step = sum_blocked / m;
  r.important_ms = sum_imp / m;
  r.pack_ms = sum_pack / m;
  r.push_ms = sum_push / m;
  r.apply_ms = sum_apply / m;
  r.bytes_up_per_step = sum_up / m;
  r.bytes_down_per_step = sum_down / m;
  r.wire_bytes_per_step = (sum_up + sum_down) / m;
  r.emulated_busy_ms = sum_busy / m;
  r.pcie_bytes_per_step = sum_pcie / m;
  opt.reset();
  ZF_RETURN_IF_ERROR(client->DeleteJob(want.job_id()));  // frees the daemon's 20 B/param
  return r;
}

// One mode's figures as a JSON object (the value of "modes"."<mode>").
void WriteMode(const ModeResult& r, bool emulated, JsonWriter* w) {
  w->BeginObject();
  w->Key("mean_step_ms").Double(r.mean_step_ms);
  w->Key("stall_ms_per_step").Double(r.stall_ms_per_step);
  w->Key("wire_bytes_per_step").Double(r.wire_bytes_per_step);
  w->Key("steps").Int(r.steps);
  w->Key("warmup_steps").Int(r.warmup_steps);
  w->Key("measured_steps").Int(r.measured_steps);
  w->Key("update_interval").Int(r.interval);
  w->Key("s_mean").Double(r.s_mean);
  w->Key("divergence");
  if (r.divergence >= 0) {
    w->Double(r.divergence);
  } else {
    w->Null();
  }
  w->Key("mean_optimizer_ms").Double(r.mean_optimizer_ms);
  w->Key("send_blocked_ms_per_step").Double(r.send_blocked_ms_per_step);
  w->Key("bytes_up_per_step").Double(r.bytes_up_per_step);
  w->Key("bytes_down_per_step").Double(r.bytes_down_per_step);
  w->Key("min_step_ms").Double(r.min_step_ms);
  w->Key("max_step_ms").Double(r.max_step_ms);
  w->Key("finish_ms").Double(r.finish_ms);
  w->Key("setup_s").Double(r.setup_s);
  w->Key("staging_bytes").Int(r.staging_bytes);
  w->Key("rounds_applied").Int(r.rounds_applied);
  w->Key("reselections").Int(r.reselections);
  if (emulated) {
    w->Key("emulated_device_busy_ms_per_step").Double(r.emulated_busy_ms);
    w->Key("pcie_bytes_per_step").Double(r.pcie_bytes_per_step);
  }
  w->Key("step_breakdown_ms").BeginObject();
  w->Key("important").Double(r.important_ms);
  w->Key("pack").Double(r.pack_ms);
  w->Key("push").Double(r.push_ms);
  w->Key("apply").Double(r.apply_ms);
  w->EndObject();
  w->EndObject();
}

absl::Status Run() {
  if (absl::GetFlag(FLAGS_target).empty()) return absl::InvalidArgumentError("--target is required");
  const std::string param_dtype = absl::GetFlag(FLAGS_param_dtype);
  if (param_dtype != "fp32" && param_dtype != "bf16" && param_dtype != "fp16") {
    return absl::InvalidArgumentError(
        absl::StrCat("--param_dtype must be fp32, bf16 or fp16, not '", param_dtype, "'"));
  }
  const int64_t want_params = absl::GetFlag(FLAGS_params);
  const int ntensors = absl::GetFlag(FLAGS_tensors);
  const int device_ms = absl::GetFlag(FLAGS_device_ms);
  const int threads = absl::GetFlag(FLAGS_threads);
  const int zf_steps = absl::GetFlag(FLAGS_steps);
  const int zo_steps = absl::GetFlag(FLAGS_zero_offload_steps) < 0 ? zf_steps
                                                                   : absl::GetFlag(FLAGS_zero_offload_steps);
  if (ntensors < 1 || device_ms < 0 || threads < 1) {
    return absl::InvalidArgumentError("--tensors and --threads must be >= 1, --device_ms >= 0");
  }
  const int64_t cols = want_params / kRows / ntensors;
  if (cols < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--params must be at least ", kRows * ntensors));
  }
  const double t_start = Now();
  const std::string device = absl::GetFlag(FLAGS_device);
  const bool emulated = device == "emulated";
  // "none": the kernels really run (cpu, cuda); otherwise the profile.
  std::string device_profile = "none";
  std::string device_label = device;
  std::unique_ptr<worker::Backend> be;
  if (device == "cuda") {
    ZF_ASSIGN_OR_RETURN(be, worker::MakeCudaBackend(0));
  } else if (device == "cpu") {
    be = worker::MakeCpuBackend(threads);
  } else if (emulated) {
    ZF_ASSIGN_OR_RETURN(std::unique_ptr<worker::EmulatedBackend> emu,
                        worker::MakeEmulatedBackend(absl::GetFlag(FLAGS_device_profile)));
    device_profile = emu->profile().name;
    device_label = absl::StrCat("EMULATED DEVICE ", emu->name(), " (", emu->profile().description,
                                "; modelled times, no numerics)");
    be = std::move(emu);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--device must be cpu, cuda or emulated, not '", device, "'"));
  }
  std::vector<Tensor> model(ntensors + 1);
  int64_t total = 0;
  for (int i = 0; i <= ntensors; ++i) {
    Tensor& t = model[i];
    if (i < ntensors) {
      t.name = absl::StrCat("w", i);
      t.shape = {kRows, cols};
    } else {
      t.name = "norm";
      t.shape = {kVector};
    }
    t.n = 1;
    for (int64_t d : t.shape) t.n *= d;
    total += t.n;
    ZF_RETURN_IF_ERROR(t.param.Reserve(be.get(), t.n * DTypeSize(ParamDType())));
    ZF_RETURN_IF_ERROR(t.grad.Reserve(be.get(), t.n * sizeof(float)));
    ZF_RETURN_IF_ERROR(Fill(be.get(), t, /*grad=*/true, 7 + i));  // once, for every step
  }
  std::fprintf(stderr,
               "stall_bench: %lld params (%d x [%lld, %lld] + [%lld]), EMULATED device time %d ms/step, "
               "synthetic gradients, kernels on %s (threads %d), daemon %s\n",
               static_cast<long long>(total), ntensors, static_cast<long long>(kRows),
               static_cast<long long>(cols), static_cast<long long>(kVector), device_ms,
               device_label.c_str(), threads, absl::GetFlag(FLAGS_target).c_str());

  std::vector<ModeResult> res;
  for (const auto& [mode, steps] : {std::pair<std::string, int>{"zero_offload", zo_steps},
                                    std::pair<std::string, int>{"zenflow", zf_steps}}) {
    ZF_ASSIGN_OR_RETURN(ModeResult r, RunMode(mode, steps, be.get(), model));
    res.push_back(r);
  }
  const ModeResult& zo = res[0];
  const ModeResult& zf = res[1];
  const double speedup = zf.mean_step_ms > 0 ? zo.mean_step_ms / zf.mean_step_ms : 0;
  const double stall_fraction = zf.mean_step_ms > 0 ? zf.stall_ms_per_step / zf.mean_step_ms : 0;
  // The yardstick: zero_offload moving bf16 gradients down and bf16
  // parameters up every step, 4 B/param. With --param_dtype=fp32 our
  // zero_offload returns fp32 values, so its measured bytes are larger;
  // the measured ratio is reported too, under its own name.
  const double bf16_zero_offload_bytes = 4.0 * static_cast<double>(total);
  const double wire_ratio = zf.wire_bytes_per_step / bf16_zero_offload_bytes;
  const double wire_ratio_measured =
      zo.wire_bytes_per_step > 0 ? zf.wire_bytes_per_step / zo.wire_bytes_per_step : 0;
  const bool cpu_dominates = zo.mean_step_ms >= 3.0 * device_ms;
  const double runtime_s = Now() - t_start;

  JsonWriter json;
  json.BeginObject();
  json.Key("emulated").Bool(true);
  json.Key("device_ms").Int(device_ms);
  json.Key("params").Int(total);
  json.Key("threads").Int(threads);
  json.Key("device").String(device);
  json.Key("device_profile").String(device_profile);
  json.Key("transport").String(absl::GetFlag(FLAGS_transport));
  json.Key("param_dtype").String(DTypeName(ParamDType()));
  json.Key("gradients").String(
      "synthetic: one fixed random buffer per tensor, generated once, reused every step");
  json.Key("warmup").String(
      "every step up to the one applying the first round's update (zero_offload: 1, zenflow: "
      "2 x S) is left out of the averages");
  json.Key("mean_step").String(
      "emulated device time + ZenFlowOptimizer::Step(); Finish() not included");
  json.Key("wire_dtype").BeginObject();
  json.Key("zero_offload").String("bf16");
  json.Key("zenflow").String(ZenflowWire());
  json.EndObject();
  json.Key("zenflow_config").BeginObject();
  json.Key("topk_ratio").Double(absl::GetFlag(FLAGS_topk));
  json.Key("update_interval").Int(zf.interval);
  json.Key("auto_update_interval").Bool(absl::GetFlag(FLAGS_auto_interval));
  json.Key("apply_delay").String("adaptive");
  json.EndObject();
  json.Key("modes").BeginObject();
  json.Key("zero_offload");
  WriteMode(zo, emulated, &json);
  json.Key("zenflow");
  WriteMode(zf, emulated, &json);
  json.EndObject();
  json.Key("speedup_vs_zero_offload").Double(speedup);
  json.Key("stall_fraction").Double(stall_fraction);
  json.Key("wire_ratio").Double(wire_ratio);
  json.Key("wire_ratio_definition").String(
      "zenflow wire bytes per step / (4 B x params: zero_offload with bf16 gradients down and "
      "bf16 parameters up)");
  json.Key("wire_ratio_vs_measured_zero_offload").Double(wire_ratio_measured);
  json.Key("cpu_dominates").Bool(cpu_dominates);
  json.Key("goals").BeginObject();
  json.Key("speedup").Int(3);
  json.Key("stall_fraction").Double(0.05);
  json.Key("wire_ratio").Double(0.5);
  json.EndObject();
  json.Key("goals_met").BeginObject();
  json.Key("speedup").Bool(speedup >= 3);
  json.Key("stall_fraction").Bool(stall_fraction <= 0.05);
  json.Key("wire_ratio").Bool(wire_ratio <= 0.5);
  json.EndObject();
  json.Key("runtime_s").Double(runtime_s);
  json.EndObject();
  const std::string out = absl::GetFlag(FLAGS_out);
  ZF_RETURN_IF_ERROR(json.WriteFile(out));

  std::printf("\nstall_bench (EMULATED device %d ms/step, %lld params, kernels on %s, worker "
              "threads %d, %s; warm-up: up to the first round's update)\n",
              device_ms, static_cast<long long>(total), device_label.c_str(), threads,
              absl::GetFlag(FLAGS_transport).c_str());
  std::printf("%-13s %6s %12s %12s %10s %16s\n", "mode", "steps", "step ms", "stall ms", "stall %",
              "wire MiB/step");
  for (const ModeResult& r : res) {
    std::printf("%-13s %6d %12.1f %12.1f %9.1f%% %16.1f\n", r.mode.c_str(), r.measured_steps,
                r.mean_step_ms, r.stall_ms_per_step,
                r.mean_step_ms > 0 ? 100.0 * r.stall_ms_per_step / r.mean_step_ms : 0.0,
                r.wire_bytes_per_step / (1 << 20));
  }
  std::printf("speedup %.2fx (goal 3)  stall fraction %.3f (goal <= 0.05)  wire ratio %.3f vs bf16 "
              "zero_offload (goal <= 0.5; %.3f vs the measured zero_offload, %s parameters)  "
              "cpu dominates: %s\n",
              speedup, stall_fraction, wire_ratio, wire_ratio_measured,
              DTypeName(ParamDType()), cpu_dominates ? "yes" : "no");
  std::printf("zenflow update interval: %s, mean S over its rounds %.2f\n",
              absl::GetFlag(FLAGS_auto_interval)
                  ? absl::StrCat("auto (1..", absl::GetFlag(FLAGS_interval), ")").c_str()
                  : absl::StrCat(absl::GetFlag(FLAGS_interval)).c_str(),
              zf.s_mean);
  if (zf.divergence >= 0) {
    std::printf("zenflow update divergence (docs/design.md rule 14): %.3f, mean over the measured "
                "rounds\n",
                zf.divergence);
  }
  if (emulated) {
    std::printf("EMULATED DEVICE %s: modelled device busy per step (kernels + PCIe copies of "
                "Step()): zero_offload %.1f ms, zenflow %.1f ms\n",
                device_profile.c_str(), zo.emulated_busy_ms, zf.emulated_busy_ms);
  }
  std::printf("runtime %.1f s; JSON in %s\n", runtime_s, out.c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace zenflow

int main(int argc, char** argv) {
  return zenflow::RunBenchMain(
      argc, argv, "stall_bench",
      "zero_offload vs zenflow step time, stall and wire bytes; emulated device time, real "
      "engine and daemon (see --target).",
      zenflow::Run);
}
