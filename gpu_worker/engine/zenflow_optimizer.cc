// The worker side of ZenFlow; see zenflow_optimizer.h.
#include "gpu_worker/engine/zenflow_optimizer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/dtype_proto.h"
#include "common/geometry.h"
#include "common/worker_stats.h"
#include "common/selection.h"
#include "common/status_macros.h"

namespace zenflow {
namespace {

using worker::Backend;
using worker::PackDType;

constexpr size_t kStageBytes = 4 << 20;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

absl::StatusOr<v1::JobSpec> JoinOrCreateJob(Client* client, const v1::JobSpec& want, int32_t rank,
                                            worker::Backend* backend,
                                            const std::vector<ParamSpec>& params) {
  if (rank == 0) {
    v1::JobSpec spec = want;
    for (v1::TensorSpec& ts : *spec.mutable_tensors()) {
      if (ts.dtype() != v1::DTYPE_UNSPECIFIED) continue;
      for (const ParamSpec& p : params) {
        if (p.name == ts.name()) ts.set_dtype(ToProto(p.dtype));
      }
    }
    absl::StatusOr<v1::JobSpec> created = client->CreateJob(spec);
    if (!created.ok() && created.status().code() != absl::StatusCode::kAlreadyExists) {
      return created.status();
    }
    if (!created.ok()) {
      // The id is taken. Rank 0 goes on only with a job its token reaches
      // and no process of this rank has joined (one made by hand, or whose
      // first rank 0 died before joining); otherwise the daemon's answer
      // says what holds the id and what to do (a job still running, or a
      // run's job that was kept or never finished).
      absl::StatusOr<v1::GetJobResponse> job = client->GetJob(want.job_id());
      if (!job.ok()) return created.status();
      for (int32_t r : job->joined_ranks()) {
        if (r == rank) return created.status();
      }
    }
    // The values go up in the parameters' own dtype: the daemon decodes them
    // into its fp32 master exactly, and a bf16 model uploads half the bytes.
    std::vector<std::vector<char>> host(params.size());
    std::vector<Client::TensorValues> values;
    for (size_t i = 0; i < params.size(); ++i) {
      int64_t n = 1;
      for (int64_t d : params[i].shape) n *= d;
      host[i].resize(n * DTypeSize(params[i].dtype));
      ZF_RETURN_IF_ERROR(backend->CopyToHost(host[i].data(), params[i].param, host[i].size()));
    }
    ZF_RETURN_IF_ERROR(backend->Synchronize());
    for (size_t i = 0; i < params.size(); ++i) {
      values.push_back({params[i].name, params[i].shape, host[i].data(), params[i].dtype});
    }
    absl::Status up = client->UploadParameters(want.job_id(), values).status();
    if (!up.ok() && up.code() != absl::StatusCode::kAlreadyExists) return up;
  } else {
    // Wait until rank 0 created the job and uploaded the parameters.
    ZF_RETURN_IF_ERROR(client->WaitForUpload(want.job_id(), absl::Minutes(5)).status());
  }
  absl::StatusOr<v1::JoinJobResponse> joined = client->JoinJob(want.job_id(), rank);
  if (joined.status().code() == absl::StatusCode::kAlreadyExists) {
    // An earlier process of this rank joined: the daemon kept the job, but
    // this process has none of the rank's worker state.
    return absl::FailedPreconditionError(absl::StrCat(
        joined.status().message(), " (by an earlier process of this rank): a new process has "
        "none of the rank's worker state (its important columns, their Adam moments, its "
        "step), so it cannot continue the job; stop the job's other ranks and start every "
        "rank again under a new job id (or after DeleteJob), e.g. from the last saved "
        "parameters (zf_train --save, then --init)"));
  }
  ZF_RETURN_IF_ERROR(joined.status());
  return joined->spec();
}

ZenFlowOptimizer::ZenFlowOptimizer(Backend* backend, Client* client, const v1::JobSpec& spec,
                                   int32_t rank)
    : backend_(backend),
      client_(client),
      spec_(spec),
      rank_(rank),
      // The predicted step as the daemon decides it.
      policy_(spec, RoundsMayCarryPredictedState(spec)),
      predicted_(backend, spec.adamw(), RoundsMayCarryPredictedState(spec)),
      local_(backend, spec),
      reselection_(backend, client, spec.zenflow().importance()) {}

ZenFlowOptimizer::~ZenFlowOptimizer() {
  // The client may still be sending from the host buffers: wait for it to
  // let go. It does once its sends end, fail or its stream breaks; if that
  // somehow takes a minute, leak the buffers rather than free them under it.
  bool released;
  {
    MutexLock lock(&ring_->mu);
    released = ring_->mu.AwaitWithTimeout(
        [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
          for (bool b : ring_->busy) {
            if (b) return false;
          }
          return true;
        },
        absl::Minutes(1));
  }
  for (size_t i = 0; i < stage_dev_.size(); ++i) {
    if (stage_dev_[i] != nullptr && stage_dev_[i] != stage_host_[i]) backend_->Free(stage_dev_[i]);
    if (stage_host_[i] != nullptr && released) {
      if (backend_->name() == "cpu") {
        backend_->Free(stage_host_[i]);
      } else {
        backend_->FreeHost(stage_host_[i]);
      }
    }
  }
}

absl::StatusOr<std::unique_ptr<ZenFlowOptimizer>> ZenFlowOptimizer::Create(
    Backend* backend, Client* client, const v1::JobSpec& spec, int32_t rank,
    std::vector<ParamSpec> params, EngineOptions options) {
  if (backend == nullptr || client == nullptr) {
    return absl::InvalidArgumentError("ZenFlowOptimizer needs a backend and a client");
  }
  if (rank < 0 || rank >= spec.world_size()) {
    return absl::OutOfRangeError(absl::StrCat("rank ", rank, " out of range [0, ",
                                              spec.world_size(), ") of job '", spec.job_id(), "'"));
  }
  std::unique_ptr<ZenFlowOptimizer> opt(new ZenFlowOptimizer(backend, client, spec, rank));
  opt->options_ = options;
  ZF_RETURN_IF_ERROR(opt->Init(std::move(params)));
  return opt;
}

absl::Status ZenFlowOptimizer::Init(std::vector<ParamSpec> params) {
  if (spec_.wire_dtype() == v1::DTYPE_INT8) {
    wire_ = DType::kF32;  // unused for int8
    pack_wire_ = PackDType::kInt8;
  } else {
    ZF_ASSIGN_OR_RETURN(wire_, FromProto(spec_.wire_dtype(), "the job's wire_dtype"));
    pack_wire_ = wire_ == DType::kF32    ? PackDType::kF32
                 : wire_ == DType::kF16 ? PackDType::kF16
                                        : PackDType::kBF16;
  }
  if (static_cast<int>(params.size()) != spec_.tensors_size()) {
    return absl::InvalidArgumentError(absl::StrCat("the model has ", params.size(),
                                                   " tensors but job '", spec_.job_id(), "' has ",
                                                   spec_.tensors_size()));
  }
  const float k = spec_.zenflow().topk_ratio();
  for (int i = 0; i < spec_.tensors_size(); ++i) {
    const v1::TensorSpec& ts = spec_.tensors(i);
    const ParamSpec* p = nullptr;
    for (const ParamSpec& x : params) {
      if (x.name == ts.name()) p = &x;
    }
    if (p == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("job tensor '", ts.name(), "' is not among the model's parameters"));
    }
    bool same = static_cast<int>(p->shape.size()) == ts.shape_size();
    for (int d = 0; same && d < ts.shape_size(); ++d) same = p->shape[d] == ts.shape(d);
    if (!same) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", ts.name(), "': the model's shape [", absl::StrJoin(p->shape, ", "),
          "] disagrees with the job's [", absl::StrJoin(ts.shape(), ", "), "]"));
    }
    if (p->param == nullptr || p->grad == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", ts.name(), "': parameter and gradient buffers are required"));
    }
    ZF_ASSIGN_OR_RETURN(
        const DType job_dtype,
        FromProto(ts.dtype() == v1::DTYPE_UNSPECIFIED ? v1::DTYPE_FP32 : ts.dtype(),
                  absl::StrCat("tensor '", ts.name(), "' dtype")));
    if (job_dtype != p->dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", ts.name(), "': the model's parameters are ", DTypeName(p->dtype),
          " but the job's TensorSpec.dtype is ", DTypeName(job_dtype),
          "; the daemon sends values in the job's dtype, so create the job with the "
          "parameters' dtype (JoinOrCreateJob fills in an unset one)"));
    }
    if (p->dtype != DType::kF32 && spec_.delta_kind() == v1::DELTA_ARITHMETIC) {
      // new - old of the daemon's fp32 master, added to a rounded parameter,
      // would drift from that master by a rounding every round.
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", ts.name(), "': ", DTypeName(p->dtype), " parameters take DELTA_VALUES "
          "deltas (the daemon's fp32 master, rounded); DELTA_ARITHMETIC is for fp32 "
          "parameters only: create the job with delta_kind DELTA_VALUES (the default)"));
    }
    auto t = std::make_unique<EngineTensor>();
    t->name = ts.name();
    t->dtype = p->dtype;
    const ColumnGeometry geo = GeometryOf(ts);
    t->rows = geo.rows;
    t->cols = geo.cols;
    t->always_important = AlwaysImportant(ts, spec_.mode());
    t->param = p->param;
    t->grad = p->grad;
    const int64_t cap = policy_.zero_offload() ? 0 : t->always_important ? t->cols : TopKCount(k, t->cols);
    const size_t capn = static_cast<size_t>(std::max<int64_t>(cap, 1) * t->rows);
    ZF_RETURN_IF_ERROR(t->d_important.Reserve(backend_, std::max<int64_t>(cap, 1) * 4));
    ZF_RETURN_IF_ERROR(t->d_remote.Reserve(backend_, t->cols * 4));
    ZF_RETURN_IF_ERROR(t->d_steps.Reserve(backend_, std::max<int64_t>(cap, 1) * 8));
    ZF_RETURN_IF_ERROR(t->m.Reserve(backend_, capn * 4));
    ZF_RETURN_IF_ERROR(t->v.Reserve(backend_, capn * 4));
    if (!t->fp32()) ZF_RETURN_IF_ERROR(t->master.Reserve(backend_, capn * 4));
    ZF_RETURN_IF_ERROR(t->gbuf.Reserve(backend_, capn * 4));
    ZF_RETURN_IF_ERROR(t->scores.Reserve(backend_, t->cols * 4));
    // Version 0: every column remote.
    ZF_RETURN_IF_ERROR(SetImportantColumns(backend_, *t, {}));
    tensors_.push_back(std::move(t));
  }
  // Delta bytes of a one-step round with the predicted step's state over
  // those without.
  double plain = 0, with_state = 0;
  for (const auto& t : tensors_) {
    if (t->always_important) continue;
    const double n = static_cast<double>(t->rows * t->cols);
    plain += n * (t->fp32() ? 4 : 2);
    with_state += n * ((t->fp32() ? 4 : 2) + kPredictedStateBytesPerValue);
  }
  policy_.set_moment_factor(plain > 0 ? with_state / plain : 1.0);
  stage_bytes_ = kStageBytes;
  for (const auto& t : tensors_) {
    stage_bytes_ = std::max<size_t>(stage_bytes_, t->rows * 4);  // at least one column
  }
  stages_ = static_cast<int>(std::max<size_t>(
      2, (options_.staging_bytes + stage_bytes_ - 1) / stage_bytes_));
  stage_dev_.assign(stages_, nullptr);
  stage_host_.assign(stages_, nullptr);
  scales_host_.resize(stages_);
  scales_dev_ = std::make_unique<worker::DeviceBuffer[]>(stages_);
  {
    MutexLock lock(&ring_->mu);
    ring_->busy.assign(stages_, false);
  }
  for (int i = 0; i < stages_; ++i) {
    if (backend_->name() == "cpu") {
      ZF_ASSIGN_OR_RETURN(stage_host_[i], backend_->Alloc(stage_bytes_));
      stage_dev_[i] = stage_host_[i];  // host memory already: pack in place
    } else {
      ZF_ASSIGN_OR_RETURN(stage_dev_[i], backend_->Alloc(stage_bytes_));
      ZF_ASSIGN_OR_RETURN(stage_host_[i], backend_->AllocHost(stage_bytes_));
    }
  }
  return absl::OkStatus();
}

absl::Status ZenFlowOptimizer::Step(int64_t step, float lr) {
  if (step != next_step_) {
    return step < next_step_
               ? absl::FailedPreconditionError(absl::StrCat("step ", step,
                                                            " was already run; the next step is ",
                                                            next_step_))
               : absl::OutOfRangeError(absl::StrCat("step ", step, " skips ahead; the next step is ",
                                                    next_step_));
  }
  if (!(lr >= 0 && std::isfinite(lr))) {
    return absl::InvalidArgumentError(absl::StrCat("lr ", lr, " must be finite and >= 0"));
  }
  const double t0 = Now();
  // Bytes and send waits count from the end of the previous step: deltas
  // arrive while the model runs forward and backward too.
  const ClientStats before = have_snapshot_ ? snapshot_ : client_->stats();
  last_ = StepStats();
  last_.step = step;
  predicted_.Begin(false, lr);  // a drain below applies without one
  local_.Begin(false, lr);
  const bool selection = policy_.IsSelectionStep(step);
  if (selection) {
    ZF_RETURN_IF_ERROR(ApplyDue(step, /*drain=*/true));  // rule 8: drain first
    ZF_ASSIGN_OR_RETURN(version_, reselection_.Run(step, tensors_));
    local_.Reset();  // rule 13: the daemon's columns changed
    last_.reselected = true;
    ++totals_.reselections;
  }
  if (round_steps_ == 0) {  // the round's first step
    PendingRound* previous =
        !pending_.empty() && pending_.back().round == round_ - 1 ? &pending_.back() : nullptr;
    round_steps_ = policy_.ChooseInterval(round_, step, previous);
  }
  last_.update_interval = round_steps_;
  predicted_.Begin(PredictedStep::Decide(predicted_.enabled(), step, round_steps_, pending_), lr);
  const bool closes = step == round_start_ + round_steps_ - 1;
  local_.Begin(local_.Decide(step, selection, predicted_.now(), closes, pending_), lr);
  const double t_imp = Now();
  ZF_RETURN_IF_ERROR(UpdateImportant(step, lr));
  last_.important_seconds = Now() - t_imp;
  ZF_RETURN_IF_ERROR(PushRemote(step));
  if (closes) {
    ZF_RETURN_IF_ERROR(CloseRound(round_, lr, round_steps_));
    pending_.push_back({round_, step, -1, round_steps_});
    totals_.rounds_closed += 1;
    totals_.round_steps += round_steps_;
    round_ += 1;
    round_start_ = step + 1;
    round_steps_ = 0;
  }
  next_step_ = step + 1;
  last_lr_ = lr;
  ZF_RETURN_IF_ERROR(ApplyDue(step, /*drain=*/false));
  if (predicted_.now() && step == 0) ZF_RETURN_IF_ERROR(predicted_.FromZero(tensors_));
  if (predicted_.End(step)) {
    last_.predicted = true;
    totals_.predicted_steps += 1;
  }
  ZF_ASSIGN_OR_RETURN(last_.local_step, local_.End(tensors_));  // rule 13
  totals_.local_steps += last_.local_step ? 1 : 0;
  const ClientStats after = client_->stats();
  snapshot_ = after;
  have_snapshot_ = true;
  last_.send_blocked_seconds = after.send_blocked_seconds - before.send_blocked_seconds;
  last_.bytes_sent = after.bytes_sent - before.bytes_sent;
  last_.bytes_received = after.bytes_received - before.bytes_received;
  last_.step_seconds = Now() - t0;
  totals_.steps += 1;
  totals_.stall_seconds += last_.stall_seconds;
  totals_.send_blocked_seconds += last_.send_blocked_seconds;
  totals_.step_seconds += last_.step_seconds;
  totals_.bytes_sent += last_.bytes_sent;
  totals_.bytes_received += last_.bytes_received;
  totals_.rounds_applied += last_.rounds_applied;
  v1::StepReport report;
  report.set_step_seconds(last_.step_seconds);
  report.set_stall_seconds(last_.stall_seconds);
  report.set_send_blocked_seconds(last_.send_blocked_seconds);
  report.set_up_bytes(last_.bytes_sent);
  report.set_down_bytes(last_.bytes_received);
  unreported_.push_back(report);
  last_report_ = report;
  last_staleness_ = std::max<int64_t>(last_staleness_, last_.max_staleness_steps);
  return absl::OkStatus();
}

absl::Status ZenFlowOptimizer::CloseRound(int64_t round, float lr, int32_t steps) {
  Client::WorkerReport report;
  // A close carries at most `steps` reports: fold any excess into the first
  // (sums stay exact; only the per-step histogram sees one merged step).
  while (static_cast<int32_t>(unreported_.size()) > std::max(steps, 1)) {
    v1::StepReport& a = unreported_[0];
    const v1::StepReport& b = unreported_[1];
    a.set_step_seconds(a.step_seconds() + b.step_seconds());
    a.set_stall_seconds(a.stall_seconds() + b.stall_seconds());
    a.set_send_blocked_seconds(a.send_blocked_seconds() + b.send_blocked_seconds());
    a.set_up_bytes(a.up_bytes() + b.up_bytes());
    a.set_down_bytes(a.down_bytes() + b.down_bytes());
    unreported_.erase(unreported_.begin() + 1);
  }
  report.steps = unreported_;
  const int32_t delay = policy_.apply_delay(round - 1);
  report.apply_delay_steps = std::max(delay, 0);
  report.staleness_steps = static_cast<int32_t>(std::min<int64_t>(last_staleness_, 1 << 30));
  ZF_RETURN_IF_ERROR(client_->CloseRound(round, lr, steps, report));
  for (const v1::StepReport& r : unreported_) AddStep(r, &reported_);
  reported_.set_apply_delay_steps(report.apply_delay_steps);
  reported_.set_staleness_steps(report.staleness_steps);
  unreported_.clear();
  last_staleness_ = 0;
  return absl::OkStatus();
}

absl::Status ZenFlowOptimizer::Finish() {
  if (next_step_ > round_start_) {
    // A partial last round: close it with the steps it has.
    const int32_t steps = static_cast<int32_t>(next_step_ - round_start_);
    ZF_RETURN_IF_ERROR(CloseRound(round_, last_lr_, steps));
    pending_.push_back({round_, next_step_ - 1, 0, steps});
    totals_.rounds_closed += 1;
    totals_.round_steps += steps;
    round_ += 1;
    round_start_ = next_step_;
    round_steps_ = 0;
  }
  return ApplyDue(next_step_ - 1, /*drain=*/true);
}

absl::Status ZenFlowOptimizer::Drain() {
  if (next_step_ != round_start_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "step ", next_step_, " is inside round ", round_, " (steps ", round_start_, "..",
        round_start_ + round_steps_ - 1, "): in-flight rounds can be applied at a round "
        "boundary only"));
  }
  if (next_step_ == 0) return absl::OkStatus();
  return ApplyDue(next_step_ - 1, /*drain=*/true);
}

absl::StatusOr<std::vector<v1::ColumnState>> ZenFlowOptimizer::LocalState() {
  std::vector<v1::ColumnState> out;
  for (auto& tp : tensors_) {
    EngineTensor& t = *tp;
    const int64_t n = static_cast<int64_t>(t.important.size());
    if (n == 0) continue;
    const int64_t values = n * t.rows;
    v1::ColumnState cs;
    cs.set_tensor(t.name);
    cs.mutable_columns()->Add(t.important.begin(), t.important.end());
    cs.mutable_values()->Resize(static_cast<int>(values), 0.0f);
    cs.mutable_m()->Resize(static_cast<int>(values), 0.0f);
    cs.mutable_v()->Resize(static_cast<int>(values), 0.0f);
    if (t.fp32()) {
      ZF_RETURN_IF_ERROR(scratch_vals_.Reserve(backend_, values * 4));
      ZF_RETURN_IF_ERROR(backend_->PackColumns(t.param_f32(), t.rows, t.cols, t.d_important.i32(),
                                               n, PackDType::kF32, scratch_vals_.p(), nullptr));
      ZF_RETURN_IF_ERROR(backend_->CopyToHost(cs.mutable_values()->mutable_data(), scratch_vals_.p(), values * 4));
    } else {  // the fp32 master: the exact state (the parameter is its rounding)
      ZF_RETURN_IF_ERROR(backend_->CopyToHost(cs.mutable_values()->mutable_data(), t.master.p(), values * 4));
    }
    ZF_RETURN_IF_ERROR(backend_->CopyToHost(cs.mutable_m()->mutable_data(), t.m.p(), values * 4));
    ZF_RETURN_IF_ERROR(backend_->CopyToHost(cs.mutable_v()->mutable_data(), t.v.p(), values * 4));
    ZF_RETURN_IF_ERROR(backend_->Synchronize());
    cs.mutable_update_counts()->Add(t.steps.begin(), t.steps.end());
    out.push_back(std::move(cs));
  }
  return out;
}

absl::Status ZenFlowOptimizer::UpdateImportant(int64_t step, float lr) {
  std::vector<EngineTensor*> active;
  for (auto& t : tensors_) {
    if (!t->important.empty()) active.push_back(t.get());
  }
  // The daemon columns' gradients, reduced, for the predicted step or the
  // local step (never both in one step).
  const bool daemon_columns = predicted_.now() || local_.now();
  if (active.empty() && !daemon_columns) return absl::OkStatus();
  for (EngineTensor* t : active) {
    ZF_RETURN_IF_ERROR(backend_->PackColumns(t->grad, t->rows, t->cols, t->d_important.i32(),
                                             static_cast<int64_t>(t->important.size()),
                                             PackDType::kF32, t->gbuf.p(), nullptr));
  }
  if (daemon_columns) ZF_RETURN_IF_ERROR(predicted_.Pack(tensors_));
  // Every rank reduces the same parts in the same order: a tensor's
  // important columns, then (with a predicted or local step this step) its
  // daemon columns.
  struct Part {
    EngineTensor* t;
    float* device;
    int64_t n;
  };
  std::vector<Part> reduce;
  for (auto& tp : tensors_) {
    EngineTensor* t = tp.get();
    if (!t->important.empty()) {
      reduce.push_back({t, t->gbuf.f32(), static_cast<int64_t>(t->important.size()) * t->rows});
    }
    if (daemon_columns && !t->remote.empty()) {
      reduce.push_back({t, t->pbuf.f32(), static_cast<int64_t>(t->remote.size()) * t->rows});
    }
  }
  if (spec_.world_size() > 1 && reducer_) {
    // Important gradients are reduced across ranks first (rule 4), here by
    // the caller's collective, device to device.
    std::vector<ReducePart> parts;
    for (const Part& p : reduce) parts.push_back({p.t->name, p.device, p.n});
    ZF_RETURN_IF_ERROR(backend_->Synchronize());  // the packed gradients are there
    ZF_RETURN_IF_ERROR(reducer_(step, parts));
  } else if (spec_.world_size() > 1) {
    // Important gradients are reduced across ranks first (rule 4): one part
    // per tensor, its important columns' then its daemon columns' values.
    std::vector<std::vector<float>> host;
    std::vector<std::pair<std::string, const std::vector<float>*>> parts;
    std::vector<int> part_of(reduce.size());
    for (size_t i = 0; i < reduce.size(); ++i) {
      if (i == 0 || reduce[i].t != reduce[i - 1].t) host.emplace_back();
      part_of[i] = static_cast<int>(host.size()) - 1;
      host.back().resize(host.back().size() + reduce[i].n);
    }
    std::vector<size_t> at(host.size(), 0);
    for (size_t i = 0; i < reduce.size(); ++i) {
      const int k = part_of[i];
      ZF_RETURN_IF_ERROR(backend_->CopyToHost(host[k].data() + at[k], reduce[i].device, reduce[i].n * 4));
      at[k] += reduce[i].n;
    }
    ZF_RETURN_IF_ERROR(backend_->Synchronize());
    for (size_t i = 0; i < reduce.size(); ++i) {
      if (i == 0 || part_of[i] != part_of[i - 1]) parts.push_back({reduce[i].t->name, &host[part_of[i]]});
    }
    ZF_ASSIGN_OR_RETURN(std::vector<std::vector<float>> mean, client_->AllReduce(step, parts));
    at.assign(host.size(), 0);
    for (size_t i = 0; i < reduce.size(); ++i) {
      const int k = part_of[i];
      if (mean.size() != host.size() || mean[k].size() != host[k].size()) {
        return absl::InternalError("all-reduce size mismatch");
      }
      ZF_RETURN_IF_ERROR(backend_->CopyToDevice(reduce[i].device, mean[k].data() + at[k], reduce[i].n * 4));
      at[k] += reduce[i].n;
    }
  }
  const v1::AdamWConfig& a = spec_.adamw();
  const AdamWHyper h{lr, a.beta1(), a.beta2(), a.eps(), a.weight_decay()};
  for (EngineTensor* t : active) {
    for (int64_t& s : t->steps) s += 1;
    ZF_RETURN_IF_ERROR(backend_->CopyToDevice(t->d_steps.p(), t->steps.data(), t->steps.size() * 8));
    const int64_t n = static_cast<int64_t>(t->important.size());
    if (t->fp32()) {
      ZF_RETURN_IF_ERROR(backend_->SelectiveAdamW(h, 1.0f, t->param_f32(), t->rows, t->cols,
                                                  t->d_important.i32(), n, t->d_steps.i64(),
                                                  t->gbuf.f32(), t->m.f32(), t->v.f32()));
    } else {
      ZF_RETURN_IF_ERROR(backend_->SelectiveAdamW16(
          h, 1.0f, t->param, Param16(t->dtype), t->rows, t->cols, t->d_important.i32(), n,
          t->d_steps.i64(), t->gbuf.f32(), t->master.f32(), t->m.f32(), t->v.f32()));
    }
  }
  return backend_->Synchronize();
}

absl::Status ZenFlowOptimizer::PushRemote(int64_t step) {
  const size_t esize = worker::PackDTypeSize(pack_wire_);
  const bool int8 = pack_wire_ == PackDType::kInt8;
  std::shared_ptr<StageRing> ring = ring_;
  // The step's shards in send order: (tensor, first remote column, columns).
  struct Chunk {
    EngineTensor* t;
    int64_t first, n;
    int buf;
  };
  std::vector<Chunk> chunks;
  for (auto& tp : tensors_) {
    EngineTensor* t = tp.get();
    const int64_t per =
        ColumnsPerMessage(static_cast<int64_t>(stage_bytes_), t->rows, static_cast<int64_t>(esize));
    for (int64_t first = 0; first < static_cast<int64_t>(t->remote.size()); first += per) {
      chunks.push_back({t, first, std::min<int64_t>(per, static_cast<int64_t>(t->remote.size()) - first), 0});
    }
  }
  // Packed a batch at a time (up to kPackBatch chunks into distinct
  // buffers, then one synchronize), then pushed in order: one device round
  // trip per batch instead of per 4 MiB chunk.
  const size_t batch = std::min<size_t>(kPackBatch, static_cast<size_t>(stages_));
  for (size_t b = 0; b < chunks.size(); b += batch) {
    const size_t e = std::min(chunks.size(), b + batch);
    double waited = 0;
    const double t_pack = Now();
    for (size_t i = b; i < e; ++i) {
      Chunk& c = chunks[i];
      c.buf = next_stage_;
      next_stage_ = (next_stage_ + 1) % stages_;
      {
        // The client still sends from this buffer: wait (that is send
        // backpressure, counted with the push).
        const double t0 = Now();
        MutexLock lock(&ring->mu);
        ring->mu.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !ring->busy[c.buf]; });
        waited += Now() - t0;
      }
      float* scales = nullptr;
      if (int8) {
        ZF_RETURN_IF_ERROR(scales_dev_[c.buf].Reserve(backend_, c.n * sizeof(float)));
        scales_host_[c.buf].resize(c.n);
        scales = scales_dev_[c.buf].f32();
      }
      EngineTensor* t = c.t;
      ZF_RETURN_IF_ERROR(backend_->PackColumns(t->grad, t->rows, t->cols,
                                               t->d_remote.i32() + c.first, c.n, pack_wire_,
                                               stage_dev_[c.buf], scales));
      if (stage_dev_[c.buf] != stage_host_[c.buf]) {
        ZF_RETURN_IF_ERROR(backend_->CopyToHost(stage_host_[c.buf], stage_dev_[c.buf],
                                                c.n * t->rows * esize));
      }
      if (int8) {
        ZF_RETURN_IF_ERROR(
            backend_->CopyToHost(scales_host_[c.buf].data(), scales, c.n * sizeof(float)));
      }
    }
    ZF_RETURN_IF_ERROR(backend_->Synchronize());
    const double t_push = Now();
    last_.pack_seconds += t_push - t_pack - waited;
    last_.push_seconds += waited;
    for (size_t i = b; i < e; ++i) {
      const Chunk& c = chunks[i];
      const int buf = c.buf;
      {
        MutexLock lock(&ring->mu);
        ring->busy[buf] = true;
      }
      auto release = [ring, buf] {
        MutexLock lock(&ring->mu);
        ring->busy[buf] = false;
      };
      EngineTensor* t = c.t;
      absl::Status s =
          int8 ? client_->PushInt8Borrowed(step, t->name, version_, t->remote.data() + c.first,
                                           c.n, static_cast<const int8_t*>(stage_host_[buf]),
                                           scales_host_[buf].data(), t->rows, release)
               : client_->PushEncodedBorrowed(step, t->name, version_, t->remote.data() + c.first,
                                              c.n, static_cast<const char*>(stage_host_[buf]),
                                              t->rows, wire_, release);
      ZF_RETURN_IF_ERROR(s);
    }
    last_.push_seconds += Now() - t_push;
  }
  return absl::OkStatus();
}

absl::Status ZenFlowOptimizer::ApplyDue(int64_t step, bool drain) {
  while (!pending_.empty()) {
    PendingRound& p = pending_.front();
    policy_.DecideDelayOf(&p);
    if (!drain && step < p.close_step + p.delay) break;
    ZF_RETURN_IF_ERROR(ApplyRound(p, step));
    pending_.pop_front();
  }
  return absl::OkStatus();
}

absl::Status ZenFlowOptimizer::ApplyRound(const PendingRound& p, int64_t step) {
  const double t0 = Now();
  ZF_ASSIGN_OR_RETURN(RoundUpdate u, client_->WaitRound(p.round, absl::Minutes(10)));
  const double t_apply = Now();
  last_.stall_seconds += t_apply - t0;
  absl::Cleanup count = [&] { last_.apply_seconds += Now() - t_apply; };
  const bool host_memory = backend_->name() == "cpu";
  for (v1::ParameterDelta& d : u.deltas) {
    EngineTensor* t = nullptr;
    for (auto& x : tensors_) {
      if (x->name == d.tensor()) t = x.get();
    }
    if (t == nullptr) return absl::InternalError(absl::StrCat("delta for unknown tensor '", d.tensor(), "'"));
    const int64_t n = d.columns_size();
    const bool arithmetic = d.kind() == v1::DELTA_ARITHMETIC;
    // Values come in the parameter's dtype, arithmetic deltas in fp32 (fp32
    // parameters only: Init refuses them for 16-bit ones).
    const DType want = arithmetic ? DType::kF32 : t->dtype;
    if ((arithmetic && !t->fp32()) || d.dtype() != ToProto(want) ||
        static_cast<int64_t>(d.payload().size()) !=
            n * t->rows * static_cast<int64_t>(DTypeSize(want))) {
      return absl::InternalError(absl::StrCat("delta of tensor '", t->name, "' is not ", n, " ",
                                              DTypeName(want), " columns of ",
                                              arithmetic ? "differences" : "values"));
    }
    const int32_t* cols = d.columns().data();
    const void* vals = d.payload().data();
    if (!host_memory) {  // stage through device scratch
      ZF_RETURN_IF_ERROR(scratch_cols_.Reserve(backend_, n * 4));
      ZF_RETURN_IF_ERROR(scratch_vals_.Reserve(backend_, d.payload().size()));
      ZF_RETURN_IF_ERROR(backend_->CopyToDevice(scratch_cols_.p(), cols, n * 4));
      ZF_RETURN_IF_ERROR(backend_->CopyToDevice(scratch_vals_.p(), vals, d.payload().size()));
      cols = scratch_cols_.i32();
      vals = scratch_vals_.p();
    }
    if (t->fp32()) {
      ZF_RETURN_IF_ERROR(backend_->ApplyColumns(t->param_f32(), t->rows, t->cols, cols, n,
                                                PackDType::kF32, vals, nullptr, arithmetic));
    } else {  // bf16 / fp16 values: copied into the parameter as they are
      const PackDType p16 = Param16(t->dtype);
      ZF_RETURN_IF_ERROR(
          backend_->ApplyColumns16(t->param, p16, t->rows, t->cols, cols, n, p16, vals));
    }
    // Rule 11: a one-step round applied one step late, with this step's
    // gradient at hand: the daemon's next step of these columns, here.
    if (predicted_.Carries(p, step, d)) ZF_RETURN_IF_ERROR(predicted_.FromDelta(t, d, cols));
    ZF_RETURN_IF_ERROR(local_.FromDelta(*t, d));  // rule 13: the factored moment
    ZF_RETURN_IF_ERROR(backend_->Synchronize());
    client_->Recycle(std::move(*d.mutable_payload()));
  }
  const int32_t steps = u.done.steps() > 0 ? u.done.steps() : p.steps;
  policy_.RoundApplied(p.round, steps, u.done.round_interval_seconds(), u.done.stall_seconds(),
                       u.done.close_to_done_seconds());
  if (u.done.has_update_divergence()) {
    // docs/design.md rule 14: auto keeps S within fidelity_budget; a fixed
    // S beyond it is told once (by rank 0).
    policy_.RoundDivergence(steps, u.done.update_divergence());
    totals_.divergence_rounds += 1;
    totals_.divergence_sum += u.done.update_divergence();
    const std::optional<float> over = policy_.TakeBudgetWarning();
    if (over && rank_ == 0) {
      std::fprintf(stderr,
                   "zenflow: update_interval %d has an update divergence of %.3f (median of the "
                   "last 5 rounds), above fidelity_budget %.3f: the daemon's columns move unlike "
                   "per-step AdamW (docs/design.md rule 14; update_interval auto keeps within it)\n",
                   steps, *over, spec_.zenflow().fidelity_budget());
    }
  }
  last_.rounds_applied += 1;
  last_.max_staleness_steps = std::max(last_.max_staleness_steps, step - p.close_step);
  return absl::OkStatus();
}

}  // namespace zenflow
