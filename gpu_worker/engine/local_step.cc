// The local step; see local_step.h.
#include "gpu_worker/engine/local_step.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace zenflow {

using worker::PackDType;

LocalStep::LocalStep(worker::Backend* backend, const v1::JobSpec& spec)
    : backend_(backend),
      enabled_(EnabledFor(spec)),
      sync_(spec.zenflow().apply_delay().kind_case() == v1::ApplyDelay::kSync),
      eps_(spec.adamw().eps()) {}

bool LocalStep::EnabledFor(const v1::JobSpec& spec) {
  const bool option = spec.zenflow().has_local_step() ? spec.zenflow().local_step() : true;
  return option && spec.mode() == v1::MODE_ZENFLOW &&
         spec.delta_kind() != v1::DELTA_ARITHMETIC;
}

bool LocalStep::Decide(int64_t step, bool selection, bool predicted, bool closes_round,
                       const std::deque<PendingRound>& pending) const {
  if (!enabled_ || selection || predicted) return false;
  // Sync: the round closing at this step is applied at its end with this
  // step's gradient in it; a local step on top would count it twice.
  if (sync_ && closes_round) return false;
  for (const auto& [t, f] : state_) {
    if (Ready(*t)) return true;
  }
  // None yet (a new job, or a reselection since): one arrives with the
  // first round applied at this step's end. The front round's delay was
  // decided when the previous step applied what was due.
  if (pending.empty()) return false;
  const PendingRound& p = pending.front();
  return p.delay >= 0 && p.close_step < step && p.close_step + p.delay <= step;
}

void LocalStep::Reset() { state_.clear(); }

absl::Status LocalStep::FromDelta(const EngineTensor& t, const v1::ParameterDelta& d) {
  if (!enabled_ || d.row_v().empty()) return absl::OkStatus();
  if (d.row_v_size() != t.rows || d.col_v_size() != d.columns_size()) {
    return absl::InternalError(absl::StrCat(
        "delta of tensor '", t.name, "' (round ", d.round(), ") carries ", d.row_v_size(),
        " row moments for ", t.rows, " rows and ", d.col_v_size(), " column moments for ",
        d.columns_size(), " columns"));
  }
  if (d.columns_size() == 0) return absl::OkStatus();
  std::unique_ptr<Factored>& slot = state_[&t];
  if (slot == nullptr || slot->have.size() != t.remote.size()) {
    slot = std::make_unique<Factored>();
    slot->col_v.assign(t.remote.size(), 0.0f);
    slot->have.assign(t.remote.size(), false);
  }
  Factored& f = *slot;
  // Each message's columns are daemon columns of this rank (the round was
  // closed under the current selection: a reselection drains first).
  for (int k = 0; k < d.columns_size(); ++k) {
    const auto at = std::lower_bound(t.remote.begin(), t.remote.end(), d.columns(k));
    if (at == t.remote.end() || *at != d.columns(k)) {
      return absl::InternalError(absl::StrCat("delta of tensor '", t.name, "' (round ", d.round(),
                                              ") has column ", d.columns(k),
                                              ", not a daemon column of this rank"));
    }
    const size_t i = static_cast<size_t>(at - t.remote.begin());
    f.col_v[i] = d.col_v(k);
    if (!f.have[i]) {
      f.have[i] = true;
      ++f.have_count;
    }
  }
  if (d.round() != f.round) {
    f.round = d.round();
    f.parts.clear();
  }
  Part& part = f.parts[d.columns(0)];
  part.columns = d.columns_size();
  part.row_v.assign(d.row_v().begin(), d.row_v().end());
  part.v_mean = d.v_mean();
  f.combined = false;
  f.staged = false;
  return absl::OkStatus();
}

void LocalStep::Combine(Factored* f) {
  if (f->combined) return;
  f->combined = true;
  const Part& first = f->parts.begin()->second;
  f->row_v = first.row_v;
  f->v_mean = first.v_mean;
  bool same = true;
  for (const auto& [c, p] : f->parts) same = same && p.row_v == first.row_v && p.v_mean == first.v_mean;
  if (same) return;  // one daemon's
  // Means over each daemon's columns, weighted by those columns: the mean
  // over all of them (in double, in column order).
  std::vector<double> rows(first.row_v.size(), 0.0);
  double mean = 0, n = 0;
  for (const auto& [c, p] : f->parts) {
    const double w = static_cast<double>(p.columns);
    for (size_t i = 0; i < rows.size(); ++i) rows[i] += w * static_cast<double>(p.row_v[i]);
    mean += w * static_cast<double>(p.v_mean);
    n += w;
  }
  for (size_t i = 0; i < rows.size(); ++i) f->row_v[i] = static_cast<float>(rows[i] / n);
  f->v_mean = static_cast<float>(mean / n);
}

bool LocalStep::Ready(const EngineTensor& t) const {
  const auto it = state_.find(&t);
  return it != state_.end() && !t.remote.empty() &&
         it->second->have_count == static_cast<int64_t>(t.remote.size());
}

absl::StatusOr<bool> LocalStep::End(const std::vector<std::unique_ptr<EngineTensor>>& tensors) {
  const bool now = now_;
  now_ = false;
  if (!now) return false;
  bool stepped = false;
  for (const auto& tp : tensors) {
    EngineTensor* t = tp.get();
    if (!Ready(*t)) continue;
    Factored& f = *state_[t];
    Combine(&f);
    const int64_t n = static_cast<int64_t>(t->remote.size());
    const float* row_v = f.row_v.data();
    const float* col_v = f.col_v.data();
    if (backend_->name() != "cpu") {  // stage once per received moment
      if (!f.staged) {
        ZF_RETURN_IF_ERROR(f.d_row_v.Reserve(backend_, f.row_v.size() * 4));
        ZF_RETURN_IF_ERROR(f.d_col_v.Reserve(backend_, f.col_v.size() * 4));
        ZF_RETURN_IF_ERROR(backend_->CopyToDevice(f.d_row_v.p(), row_v, f.row_v.size() * 4));
        ZF_RETURN_IF_ERROR(backend_->CopyToDevice(f.d_col_v.p(), col_v, f.col_v.size() * 4));
        f.staged = true;
      }
      row_v = f.d_row_v.f32();
      col_v = f.d_col_v.f32();
    }
    const PackDType w_dtype = t->fp32() ? PackDType::kF32 : Param16(t->dtype);
    ZF_RETURN_IF_ERROR(backend_->FactoredStep(lr_, eps_, t->param, w_dtype, t->rows, t->cols,
                                              t->d_remote.i32(), n, t->pbuf.f32(), row_v, col_v,
                                              f.v_mean));
    stepped = true;
  }
  if (stepped) ZF_RETURN_IF_ERROR(backend_->Synchronize());
  return stepped;
}

}  // namespace zenflow
