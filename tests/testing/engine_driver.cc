// Test support: drives the worker engine; see engine_driver.h.
#include "tests/testing/engine_driver.h"

#include <cmath>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "common/codec.h"
#include "common/dtype_proto.h"
#include "common/status_macros.h"
#include "gpu_worker/backend.h"
#include "gpu_worker/device_buffer.h"
#include "gpu_worker/engine/zenflow_optimizer.h"
#include "tests/testing/harness.h"

namespace zenflow::testing {
namespace {

DType ParamDType(const SimConfig& cfg) {
  switch (cfg.param_dtype) {
    case SimParamDType::kBF16:
      return DType::kBF16;
    case SimParamDType::kF16:
      return DType::kF16;
    case SimParamDType::kF32:
      break;
  }
  return DType::kF32;
}

float Noise(int rank, int64_t step, size_t ti, size_t i) {
  const double x = 12.9898 * (i + 1) + 78.233 * (step + 1) + 37.719 * (rank + 1) + 3.7 * ti;
  const double s = std::sin(x) * 43758.5453;
  return static_cast<float>(s - std::floor(s) - 0.5);
}

}  // namespace

std::vector<SimTensor> EngineModel() {
  std::vector<SimTensor> t = {{"w1", 8, 24, false, {}}, {"b1", 1, 24, true, {}}, {"w2", 6, 20, false, {}}};
  for (size_t ti = 0; ti < t.size(); ++ti) {
    t[ti].w.resize(t[ti].rows * t[ti].cols);
    for (size_t i = 0; i < t[ti].w.size(); ++i) {
      t[ti].w[i] = 0.05f * static_cast<float>(std::sin(0.7 * i + ti));
    }
  }
  return t;
}

std::vector<std::vector<float>> EngineGrad(const std::vector<std::vector<float>>& w, int rank,
                                           int64_t step, int select_interval) {
  const std::vector<SimTensor> model = EngineModel();
  std::vector<std::vector<float>> g(model.size());
  const int64_t epoch = step / std::max(1, select_interval);
  for (size_t ti = 0; ti < model.size(); ++ti) {
    const int64_t rows = model[ti].rows, cols = model[ti].cols;
    g[ti].resize(rows * cols);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const size_t i = r * cols + c;
        // Column scales 1.6^perm: importance well separated, and the order
        // changes every selection interval, so reselections move columns.
        const int64_t perm = (c * 7 + epoch * 5) % cols;
        const float scale = static_cast<float>(std::pow(1.6, static_cast<double>(perm)) / 100.0);
        const float target = 0.5f * static_cast<float>(std::cos(0.3 * r - 0.2 * c + ti));
        g[ti][i] = scale * ((w[ti][i] - target) + 0.3f * Noise(rank, step, ti, i));
      }
    }
  }
  return g;
}

float EngineLr(int64_t step) { return 1e-2f * (1.0f - 0.01f * static_cast<float>(step)); }

v1::JobSpec EngineSpec(const EngineJob& job) {
  v1::JobSpec spec;
  spec.set_job_id(job.job_id);
  for (const SimTensor& t : EngineModel()) {
    v1::TensorSpec* ts = spec.add_tensors();
    ts->set_name(t.name);
    ts->set_dtype(ToProto(ParamDType(job.cfg)));
    if (t.one_d) {
      ts->add_shape(t.cols);
    } else {
      ts->add_shape(t.rows);
      ts->add_shape(t.cols);
    }
  }
  spec.set_world_size(job.cfg.world);
  spec.set_rank_ordered_sums(job.rank_ordered_sums);
  spec.set_wire_dtype(job.cfg.int8_wire   ? v1::DTYPE_INT8
                      : job.cfg.bf16_wire ? v1::DTYPE_BF16
                                          : v1::DTYPE_FP32);
  spec.set_mode(job.cfg.zero_offload ? v1::MODE_ZERO_OFFLOAD : v1::MODE_ZENFLOW);
  spec.mutable_adamw()->set_beta1(job.cfg.beta1);
  spec.mutable_adamw()->set_beta2(job.cfg.beta2);
  spec.mutable_adamw()->set_eps(job.cfg.eps);
  spec.mutable_adamw()->set_weight_decay(job.cfg.wd);
  v1::ZenFlowConfig* z = spec.mutable_zenflow();
  z->set_topk_ratio(job.cfg.k);
  z->set_update_interval(job.cfg.S);
  z->set_select_interval(job.cfg.R);
  z->set_full_warmup_rounds(job.cfg.warmup_rounds);
  z->set_auto_update_interval(job.cfg.auto_interval);
  z->set_predicted_step(job.cfg.predicted_step);
  // Rules 12 and 13 as the simulator (zenflow_sim.h) models them: on by
  // default, off where a test turns them off.
  z->set_scale_round_step(job.cfg.scale_round_step);
  z->set_local_step(job.cfg.local_step);
  if (job.adaptive) {
    z->mutable_apply_delay()->set_adaptive(true);
  } else if (job.cfg.delay == 0) {
    z->mutable_apply_delay()->set_sync(true);
  } else {
    z->mutable_apply_delay()->set_steps(job.cfg.delay);
  }
  return spec;
}

absl::StatusOr<std::vector<std::vector<float>>> RunEngineRank(const EngineJob& job, int rank,
                                                              OptimizerTotals* totals,
                                                              std::vector<int32_t>* intervals) {
  std::unique_ptr<worker::Backend> backend = worker::MakeCpuBackend(1);
  std::vector<SimTensor> model = EngineModel();
  std::vector<std::unique_ptr<worker::DeviceBuffer>> params, grads;
  std::vector<ParamSpec> specs;
  // bf16 / fp16 parameters hold the initial values rounded (the codec's
  // rounding; the simulator rounds with its own).
  const DType dtype = ParamDType(job.cfg);
  const size_t esize = DTypeSize(dtype);
  for (const SimTensor& t : model) {
    auto p = std::make_unique<worker::DeviceBuffer>();
    auto g = std::make_unique<worker::DeviceBuffer>();
    ZF_RETURN_IF_ERROR(p->Reserve(backend.get(), t.w.size() * esize));
    ZF_RETURN_IF_ERROR(g->Reserve(backend.get(), t.w.size() * 4));
    std::vector<char> init(t.w.size() * esize);
    Encode(dtype, t.w.data(), t.w.size(), init.data());
    ZF_RETURN_IF_ERROR(backend->CopyToDevice(p->p(), init.data(), init.size()));
    ParamSpec ps;
    ps.name = t.name;
    ps.shape = t.one_d ? std::vector<int64_t>{t.cols} : std::vector<int64_t>{t.rows, t.cols};
    ps.param = p->p();
    ps.grad = g->f32();
    ps.dtype = dtype;
    specs.push_back(ps);
    params.push_back(std::move(p));
    grads.push_back(std::move(g));
  }
  ClientOptions co = TestClientOptions(job.target);
  co.split_tensor_params = job.split_tensor_params;
  co.max_shard_bytes = 256;  // several shards per tensor
  ZF_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Connect(co));
  ZF_ASSIGN_OR_RETURN(v1::JobSpec spec,
                      JoinOrCreateJob(client.get(), EngineSpec(job), rank, backend.get(), specs));
  ZF_ASSIGN_OR_RETURN(std::unique_ptr<ZenFlowOptimizer> opt,
                      ZenFlowOptimizer::Create(backend.get(), client.get(), spec, rank, specs,
                                               job.engine));
  if (job.reducer != nullptr) opt->set_gradient_reducer(job.reducer->ForRank(rank));
  if (job.cfg.interval_chooser) opt->set_interval_chooser(job.cfg.interval_chooser);
  if (intervals != nullptr) intervals->clear();
  std::vector<std::vector<float>> w(model.size());
  std::vector<char> raw;
  // The parameters as fp32 (what the model computes with).
  auto read = [&](size_t ti) -> absl::Status {
    w[ti].resize(model[ti].w.size());
    raw.resize(w[ti].size() * esize);
    ZF_RETURN_IF_ERROR(backend->CopyToHost(raw.data(), params[ti]->p(), raw.size()));
    Decode(dtype, raw.data(), w[ti].size(), w[ti].data());
    return absl::OkStatus();
  };
  for (int64_t t = 0; t < job.steps; ++t) {
    for (size_t ti = 0; ti < model.size(); ++ti) ZF_RETURN_IF_ERROR(read(ti));
    std::vector<std::vector<float>> g = EngineGrad(w, rank, t, job.cfg.R);
    for (size_t ti = 0; ti < model.size(); ++ti) {
      ZF_RETURN_IF_ERROR(backend->CopyToDevice(grads[ti]->p(), g[ti].data(), g[ti].size() * 4));
    }
    ZF_RETURN_IF_ERROR(opt->Step(t, EngineLr(t)));
    if (intervals != nullptr) intervals->push_back(opt->last_step().update_interval);
  }
  ZF_RETURN_IF_ERROR(opt->Finish());
  if (totals != nullptr) *totals = opt->totals();
  for (size_t ti = 0; ti < model.size(); ++ti) ZF_RETURN_IF_ERROR(read(ti));
  return w;
}

absl::StatusOr<std::vector<std::vector<std::vector<float>>>> RunEngineRanks(
    const EngineJob& job, std::vector<std::vector<int32_t>>* intervals,
    std::vector<OptimizerTotals>* totals) {
  std::vector<absl::StatusOr<std::vector<std::vector<float>>>> out(
      job.cfg.world, absl::UnknownError("not run"));
  std::vector<std::vector<int32_t>> steps(job.cfg.world);
  std::vector<OptimizerTotals> sums(job.cfg.world);
  std::vector<std::thread> threads;
  for (int r = 0; r < job.cfg.world; ++r) {
    threads.emplace_back([&, r] { out[r] = RunEngineRank(job, r, &sums[r], &steps[r]); });
  }
  for (auto& t : threads) t.join();
  std::vector<std::vector<std::vector<float>>> result;
  for (int r = 0; r < job.cfg.world; ++r) {
    if (!out[r].ok()) {
      return absl::Status(out[r].status().code(), absl::StrCat("rank ", r, ": ", out[r].status().message()));
    }
    result.push_back(*std::move(out[r]));
  }
  if (intervals != nullptr) *intervals = std::move(steps);
  if (totals != nullptr) *totals = std::move(sums);
  return result;
}

std::vector<std::vector<float>> RunSim(const EngineJob& job, std::vector<int32_t>* round_steps,
                                       int* local_steps) {
  ZenFlowSim sim(job.cfg, EngineModel());
  const size_t nt = EngineModel().size();
  for (int64_t t = 0; t < job.steps; ++t) {
    std::vector<std::vector<float>> w(nt);
    for (size_t ti = 0; ti < nt; ++ti) w[ti] = sim.params(ti);
    std::vector<std::vector<std::vector<float>>> grads;
    for (int r = 0; r < job.cfg.world; ++r) grads.push_back(EngineGrad(w, r, t, job.cfg.R));
    sim.Step(t, EngineLr(t), grads);
  }
  sim.Finish();
  if (round_steps != nullptr) *round_steps = sim.round_steps();
  if (local_steps != nullptr) *local_steps = sim.local_steps();
  std::vector<std::vector<float>> out(nt);
  for (size_t ti = 0; ti < nt; ++ti) out[ti] = sim.params(ti);
  return out;
}

double Mismatch(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b,
                double atol, double rtol, std::string* where) {
  double worst = 0;
  for (size_t t = 0; t < a.size(); ++t) {
    for (size_t i = 0; i < a[t].size(); ++i) {
      const double e = std::fabs(a[t][i] - b[t][i]) / (atol + rtol * std::fabs(b[t][i]));
      if (e > worst) {
        worst = e;
        *where = absl::StrCat("tensor ", t, " element ", i, ": ", a[t][i], " vs ", b[t][i]);
      }
    }
  }
  return worst;
}

}  // namespace zenflow::testing
