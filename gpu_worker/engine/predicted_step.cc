// The predicted step; see predicted_step.h.
#include "gpu_worker/engine/predicted_step.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace zenflow {

using worker::PackDType;

bool PredictedStep::Decide(bool enabled, int64_t step, int32_t round_steps,
                           const std::deque<PendingRound>& pending) {
  if (!enabled || round_steps != 1) return false;
  // A new job's daemon columns start from m = v = 0 and no updates: step
  // 0's prediction needs no message (round 0 is applied at step 1's end,
  // as its delay is at least 1 without sync).
  if (step == 0) return true;
  // Otherwise the one-step round of the previous step, applied at this
  // step's end (delay 1), carries the state. (A selection step drained it
  // already: no prediction there.)
  if (pending.size() != 1) return false;
  const PendingRound& p = pending.front();
  return p.close_step == step - 1 && p.steps == 1 && p.delay == 1;
}

absl::Status PredictedStep::Pack(const std::vector<std::unique_ptr<EngineTensor>>& tensors) {
  for (const auto& tp : tensors) {
    EngineTensor* t = tp.get();
    if (t->remote.empty()) continue;
    const int64_t n = static_cast<int64_t>(t->remote.size());
    ZF_RETURN_IF_ERROR(t->pbuf.Reserve(backend_, static_cast<size_t>(t->cols * t->rows) * 4));
    ZF_RETURN_IF_ERROR(backend_->PackColumns(t->grad, t->rows, t->cols, t->d_remote.i32(), n,
                                             PackDType::kF32, t->pbuf.p(), nullptr));
  }
  return absl::OkStatus();
}

absl::StatusOr<void*> PredictedStep::Staged(worker::DeviceBuffer* buf, void* host, size_t bytes) {
  if (backend_->name() == "cpu") return host;  // host memory already
  ZF_RETURN_IF_ERROR(buf->Reserve(backend_, bytes));
  ZF_RETURN_IF_ERROR(backend_->CopyToDevice(buf->p(), host, bytes));
  return buf->p();
}

absl::Status PredictedStep::AdamW(EngineTensor* t, const int32_t* cols, int64_t n,
                                  const int64_t* steps, const float* g, float* m, float* v,
                                  float* master) {
  const AdamWHyper h{lr_, adamw_.beta1(), adamw_.beta2(), adamw_.eps(), adamw_.weight_decay()};
  if (t->fp32()) {
    ZF_RETURN_IF_ERROR(backend_->SelectiveAdamW(h, 1.0f, t->param_f32(), t->rows, t->cols, cols, n,
                                                steps, g, m, v));
  } else {
    ZF_RETURN_IF_ERROR(backend_->SelectiveAdamW16(h, 1.0f, t->param, Param16(t->dtype), t->rows,
                                                  t->cols, cols, n, steps, g, master, m, v));
  }
  return backend_->Synchronize();  // the scratch is reused
}

absl::Status PredictedStep::FromDelta(EngineTensor* t, const v1::ParameterDelta& d,
                                      const int32_t* cols) {
  const int64_t n = d.columns_size();
  const size_t values = static_cast<size_t>(n * t->rows);
  if (d.m().size() != values * 2 || d.v().size() != values * 2 || d.update_counts_size() != n) {
    return absl::InternalError(absl::StrCat("delta of tensor '", t->name, "' (round ", d.round(),
                                            ") carries a malformed state for the predicted step"));
  }
  // The message's columns are a run of the rank's daemon columns.
  const auto first = std::lower_bound(t->remote.begin(), t->remote.end(), d.columns(0));
  const int64_t at = first - t->remote.begin();
  if (at + n > static_cast<int64_t>(t->remote.size()) ||
      !std::equal(d.columns().begin(), d.columns().end(), first)) {
    return absl::InternalError(absl::StrCat("delta of tensor '", t->name, "' (round ", d.round(),
                                            ") is not for this rank's daemon columns"));
  }
  std::vector<int64_t> steps(d.update_counts().begin(), d.update_counts().end());
  for (int64_t& c : steps) c += 1;
  // The state in fp32 (m and v come as bf16; a 16-bit tensor's master is
  // its values as they came).
  std::vector<float>& host = host_;
  host.resize(values * (t->fp32() ? 2 : 3));
  float* m = host.data();
  float* v = m + values;
  float* master = t->fp32() ? nullptr : v + values;
  Decode(DType::kBF16, d.m().data(), values, m);
  Decode(DType::kBF16, d.v().data(), values, v);
  if (master != nullptr) Decode(t->dtype, d.payload().data(), values, master);
  const size_t bytes = values * 4;
  ZF_ASSIGN_OR_RETURN(void* dm, Staged(&scratch_m_, m, bytes));
  ZF_ASSIGN_OR_RETURN(void* dv, Staged(&scratch_v_, v, bytes));
  ZF_ASSIGN_OR_RETURN(void* ds, Staged(&scratch_steps_, steps.data(), n * 8));
  void* dmaster = nullptr;
  if (master != nullptr) {
    ZF_ASSIGN_OR_RETURN(dmaster, Staged(&scratch_master_, master, bytes));
  }
  ZF_RETURN_IF_ERROR(AdamW(t, cols, n, static_cast<const int64_t*>(ds),
                           t->pbuf.f32() + at * t->rows, static_cast<float*>(dm),
                           static_cast<float*>(dv), static_cast<float*>(dmaster)));
  ++messages_;
  return absl::OkStatus();
}

absl::Status PredictedStep::FromZero(const std::vector<std::unique_ptr<EngineTensor>>& tensors) {
  for (const auto& tp : tensors) {
    EngineTensor* t = tp.get();
    if (t->remote.empty()) continue;
    const int64_t n = static_cast<int64_t>(t->remote.size());
    const size_t values = static_cast<size_t>(n * t->rows);
    std::vector<float>& zeros = host_;  // m, then v: written by the update
    zeros.assign(2 * values, 0.0f);
    std::vector<int64_t> ones(static_cast<size_t>(n), 1);
    ZF_ASSIGN_OR_RETURN(void* dm, Staged(&scratch_m_, zeros.data(), values * 4));
    ZF_ASSIGN_OR_RETURN(void* dv, Staged(&scratch_v_, zeros.data() + values, values * 4));
    ZF_ASSIGN_OR_RETURN(void* ds, Staged(&scratch_steps_, ones.data(), n * 8));
    float* master = nullptr;
    if (!t->fp32()) {
      // The daemon's master of these columns is the uploaded parameters'
      // exact value.
      const size_t all = static_cast<size_t>(t->rows * t->cols);
      ZF_RETURN_IF_ERROR(scratch_all_.Reserve(backend_, all * 4));
      ZF_RETURN_IF_ERROR(scratch_master_.Reserve(backend_, values * 4));
      ZF_RETURN_IF_ERROR(
          backend_->Convert(t->param, Param16(t->dtype), scratch_all_.p(), PackDType::kF32, all));
      ZF_RETURN_IF_ERROR(backend_->PackColumns(scratch_all_.f32(), t->rows, t->cols,
                                               t->d_remote.i32(), n, PackDType::kF32,
                                               scratch_master_.p(), nullptr));
      master = scratch_master_.f32();
    }
    ZF_RETURN_IF_ERROR(AdamW(t, t->d_remote.i32(), n, static_cast<const int64_t*>(ds),
                             t->pbuf.f32(), static_cast<float*>(dm), static_cast<float*>(dv),
                             master));
  }
  return absl::OkStatus();
}

}  // namespace zenflow
