// Reselection with an exact state hand-off; see reselection.h.
#include "gpu_worker/engine/reselection.h"

#include <algorithm>
#include <iterator>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace zenflow {

using worker::PackDType;

std::vector<int32_t> ColumnDifference(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  std::vector<int32_t> out;
  std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

std::vector<std::vector<size_t>> HandOffCalls(const std::vector<double>& moved, double limit) {
  std::vector<std::vector<size_t>> calls;
  double bytes = 0;
  for (size_t i = 0; i < moved.size(); ++i) {
    if (calls.empty() || (!calls.back().empty() && bytes + moved[i] > limit)) {
      calls.emplace_back();
      bytes = 0;
    }
    calls.back().push_back(i);
    bytes += moved[i];
  }
  return calls;
}

absl::StatusOr<CompactState> NextCompactState(const EngineTensor& t,
                                              const std::vector<int32_t>& now,
                                              const v1::ColumnState* join) {
  CompactState s;
  s.m.resize(now.size() * t.rows);
  s.v.resize(now.size() * t.rows);
  s.master.resize(t.fp32() ? 0 : now.size() * t.rows);
  s.steps.resize(now.size());
  for (size_t j = 0; j < now.size(); ++j) {
    const int32_t c = now[j];
    auto it = std::lower_bound(t.important.begin(), t.important.end(), c);
    if (it != t.important.end() && *it == c) {
      const size_t k = it - t.important.begin();
      std::copy_n(t.host_m.begin() + k * t.rows, t.rows, s.m.begin() + j * t.rows);
      std::copy_n(t.host_v.begin() + k * t.rows, t.rows, s.v.begin() + j * t.rows);
      if (!t.fp32()) {
        std::copy_n(t.host_master.begin() + k * t.rows, t.rows, s.master.begin() + j * t.rows);
      }
      s.steps[j] = t.steps[k];
      continue;
    }
    if (join == nullptr) return absl::InternalError(absl::StrCat("no joining state for '", t.name, "'"));
    int idx = -1;
    for (int q = 0; q < join->columns_size(); ++q) {
      if (join->columns(q) == c) idx = q;
    }
    if (idx < 0) return absl::InternalError(absl::StrCat("no joining state for column ", c));
    std::copy_n(join->m().begin() + idx * t.rows, t.rows, s.m.begin() + j * t.rows);
    std::copy_n(join->v().begin() + idx * t.rows, t.rows, s.v.begin() + j * t.rows);
    if (!t.fp32()) {  // the daemon's fp32 master becomes this rank's
      std::copy_n(join->values().begin() + idx * t.rows, t.rows, s.master.begin() + j * t.rows);
    }
    s.steps[j] = join->update_counts(idx);
  }
  return s;
}

absl::StatusOr<int64_t> Reselection::Run(
    int64_t step, const std::vector<std::unique_ptr<EngineTensor>>& tensors) {
  std::vector<v1::TensorImportance> imp;
  const worker::Importance kind = importance_ == v1::IMPORTANCE_L2_SQUARED
                                      ? worker::Importance::kL2Squared
                                      : worker::Importance::kL1;
  for (const auto& t : tensors) {
    if (t->always_important) continue;
    ZF_RETURN_IF_ERROR(backend_->ColumnImportance(t->grad, t->rows, t->cols, kind, t->scores.f32()));
    v1::TensorImportance ti;
    ti.set_tensor(t->name);
    ti.mutable_scores()->Resize(static_cast<int>(t->cols), 0.0f);
    ZF_RETURN_IF_ERROR(backend_->CopyToHost(ti.mutable_scores()->mutable_data(), t->scores.p(), t->cols * 4));
    ZF_RETURN_IF_ERROR(backend_->Synchronize());
    imp.push_back(std::move(ti));
  }
  ZF_ASSIGN_OR_RETURN(v1::Selection sel, client_->SubmitImportance(step, imp));
  std::vector<std::vector<int32_t>> chosen(tensors.size());
  for (const v1::ColumnSet& cs : sel.important()) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i]->name == cs.tensor()) chosen[i].assign(cs.columns().begin(), cs.columns().end());
    }
  }
  // Leaving columns: exact values, m, v and counts go to the daemon (at
  // most one ColumnState per tensor, in tensor order).
  std::vector<v1::ColumnState> leaving(tensors.size());
  std::vector<std::vector<int32_t>> leave_cols(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EngineTensor& t = *tensors[i];
    leave_cols[i] = ColumnDifference(t.important, chosen[i]);
    const size_t nimp = t.important.size();
    t.host_m.resize(nimp * t.rows);
    t.host_v.resize(nimp * t.rows);
    t.host_master.resize(t.fp32() ? 0 : nimp * t.rows);
    if (nimp > 0) {
      ZF_RETURN_IF_ERROR(backend_->CopyToHost(t.host_m.data(), t.m.p(), nimp * t.rows * 4));
      ZF_RETURN_IF_ERROR(backend_->CopyToHost(t.host_v.data(), t.v.p(), nimp * t.rows * 4));
      if (!t.fp32()) {
        ZF_RETURN_IF_ERROR(
            backend_->CopyToHost(t.host_master.data(), t.master.p(), nimp * t.rows * 4));
      }
    }
    if (leave_cols[i].empty()) continue;
    const int64_t n = static_cast<int64_t>(leave_cols[i].size());
    v1::ColumnState& cs = leaving[i];
    cs.set_tensor(t.name);
    if (t.fp32()) {
      ZF_RETURN_IF_ERROR(scratch_cols_.Reserve(backend_, n * 4));
      ZF_RETURN_IF_ERROR(scratch_vals_.Reserve(backend_, n * t.rows * 4));
      ZF_RETURN_IF_ERROR(backend_->CopyToDevice(scratch_cols_.p(), leave_cols[i].data(), n * 4));
      ZF_RETURN_IF_ERROR(backend_->PackColumns(t.param_f32(), t.rows, t.cols, scratch_cols_.i32(),
                                               n, PackDType::kF32, scratch_vals_.p(), nullptr));
      cs.mutable_values()->Resize(static_cast<int>(n * t.rows), 0.0f);
      ZF_RETURN_IF_ERROR(backend_->CopyToHost(cs.mutable_values()->mutable_data(), scratch_vals_.p(), n * t.rows * 4));
    }
    ZF_RETURN_IF_ERROR(backend_->Synchronize());
    for (int32_t c : leave_cols[i]) {
      const size_t k = std::lower_bound(t.important.begin(), t.important.end(), c) - t.important.begin();
      cs.add_columns(c);
      if (!t.fp32()) {  // rule 8: the fp32 master moves, not its rounding
        cs.mutable_values()->Add(t.host_master.begin() + k * t.rows,
                                 t.host_master.begin() + (k + 1) * t.rows);
      }
      cs.mutable_m()->Add(t.host_m.begin() + k * t.rows, t.host_m.begin() + (k + 1) * t.rows);
      cs.mutable_v()->Add(t.host_v.begin() + k * t.rows, t.host_v.begin() + (k + 1) * t.rows);
      cs.add_update_counts(t.steps[k]);
    }
  }
  ZF_RETURN_IF_ERROR(backend_->Synchronize());
  // Hand off in calls of at most ~kHandOffBytes each (by tensor), so no
  // message outgrows the gRPC limits on large models.
  std::vector<double> moved(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const EngineTensor& t = *tensors[i];
    moved[i] = static_cast<double>(ColumnDifference(chosen[i], t.important).size() +
                                   leave_cols[i].size()) *
               static_cast<double>(t.rows) * 12.0;
  }
  v1::HandOffResponse handoff;
  for (const std::vector<size_t>& call : HandOffCalls(moved, kHandOffBytes)) {
    std::vector<std::string> names;
    std::vector<v1::ColumnState> part;
    for (size_t i : call) {
      names.push_back(tensors[i]->name);
      if (!leave_cols[i].empty()) part.push_back(std::move(leaving[i]));
    }
    ZF_ASSIGN_OR_RETURN(v1::HandOffResponse r, client_->HandOff(sel.version(), part, names));
    for (v1::ColumnState& cs : *r.mutable_joining()) *handoff.add_joining() = std::move(cs);
  }
  // New compact state: kept columns keep theirs, joining ones get the daemon's.
  for (size_t i = 0; i < tensors.size(); ++i) {
    EngineTensor& t = *tensors[i];
    const v1::ColumnState* join = nullptr;
    for (const v1::ColumnState& cs : handoff.joining()) {
      if (cs.tensor() == t.name) join = &cs;
    }
    const std::vector<int32_t>& now = chosen[i];
    ZF_ASSIGN_OR_RETURN(CompactState state, NextCompactState(t, now, join));
    if (join != nullptr && join->columns_size() > 0) {
      const int64_t n = join->columns_size();
      ZF_RETURN_IF_ERROR(scratch_cols_.Reserve(backend_, n * 4));
      ZF_RETURN_IF_ERROR(scratch_vals_.Reserve(backend_, n * t.rows * 4));
      ZF_RETURN_IF_ERROR(backend_->CopyToDevice(scratch_cols_.p(), join->columns().data(), n * 4));
      ZF_RETURN_IF_ERROR(backend_->CopyToDevice(scratch_vals_.p(), join->values().data(), n * t.rows * 4));
      if (t.fp32()) {
        ZF_RETURN_IF_ERROR(backend_->ApplyColumns(t.param_f32(), t.rows, t.cols,
                                                  scratch_cols_.i32(), n, PackDType::kF32,
                                                  scratch_vals_.p(), nullptr, false));
      } else {  // the parameter holds the master's rounding
        ZF_RETURN_IF_ERROR(backend_->ApplyColumns16(t.param, Param16(t.dtype), t.rows, t.cols,
                                                    scratch_cols_.i32(), n, PackDType::kF32,
                                                    scratch_vals_.p()));
      }
      ZF_RETURN_IF_ERROR(backend_->Synchronize());
    }
    if (!now.empty()) {
      ZF_RETURN_IF_ERROR(backend_->CopyToDevice(t.m.p(), state.m.data(), state.m.size() * 4));
      ZF_RETURN_IF_ERROR(backend_->CopyToDevice(t.v.p(), state.v.data(), state.v.size() * 4));
      if (!t.fp32()) {
        ZF_RETURN_IF_ERROR(
            backend_->CopyToDevice(t.master.p(), state.master.data(), state.master.size() * 4));
      }
    }
    t.steps = std::move(state.steps);
    ZF_RETURN_IF_ERROR(SetImportantColumns(backend_, t, now));
  }
  return sel.version();
}

}  // namespace zenflow
