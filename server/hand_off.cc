// The hand-off of a reselection; see hand_off.h.
#include "server/hand_off.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/codec.h"
#include "common/status_macros.h"

namespace zenflow {

void ColumnsChangingHands(const std::vector<int32_t>& before, const std::vector<int32_t>& after,
                          std::vector<int32_t>* leaving, std::vector<int32_t>* joining) {
  leaving->clear();
  joining->clear();
  std::set_difference(before.begin(), before.end(), after.begin(), after.end(),
                      std::back_inserter(*leaving));
  std::set_difference(after.begin(), after.end(), before.begin(), before.end(),
                      std::back_inserter(*joining));
}

namespace {

// One covered tensor's leaving state (null: none given).
absl::Status CheckLeavingState(const HandOffTensor& t, const v1::ColumnState* cs) {
  const std::vector<int32_t>& want = t.leaving;
  const int n = cs == nullptr ? 0 : cs->columns_size();
  if (n != static_cast<int>(want.size()) ||
      (n > 0 && !std::equal(want.begin(), want.end(), cs->columns().begin()))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", t.name, "': expected the state of ", want.size(), " leaving columns [",
        absl::StrJoin(want.begin(), want.begin() + std::min<size_t>(want.size(), 8), ", "),
        want.size() > 8 ? ", ..." : "", "], got ", n));
  }
  if (n == 0) return absl::OkStatus();
  const int64_t need = static_cast<int64_t>(n) * t.rows;
  if (cs->values_size() != need || cs->m_size() != need || cs->v_size() != need ||
      cs->update_counts_size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", t.name, "': leaving state needs ", need, " values, m and v and ", n,
        " update counts; got ", cs->values_size(), ", ", cs->m_size(), ", ", cs->v_size(), " and ",
        cs->update_counts_size()));
  }
  size_t bad = 0;
  if (!AllFinite(DType::kF32, cs->values().data(), need, &bad) ||
      !AllFinite(DType::kF32, cs->m().data(), need, &bad) ||
      !AllFinite(DType::kF32, cs->v().data(), need, &bad)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", t.name, "': leaving state holds a non-finite value"));
  }
  for (int i = 0; i < n; ++i) {
    if (cs->update_counts(i) < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "': negative update count for column ", cs->columns(i)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<HandOffPlan> PlanHandOff(
    const v1::HandOffRequest& req, const std::vector<HandOffTensor>& tensors,
    const std::function<absl::StatusOr<int>(const std::string&)>& index) {
  HandOffPlan plan;
  plan.in_call.assign(tensors.size(), req.tensors_size() == 0);
  plan.given.assign(tensors.size(), nullptr);
  for (const std::string& name : req.tensors()) {
    ZF_ASSIGN_OR_RETURN(int ti, index(name));
    if (plan.in_call[ti]) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", tensors[ti].name, "' is listed twice in one hand-off"));
    }
    plan.in_call[ti] = true;
  }
  for (const v1::ColumnState& cs : req.leaving()) {
    ZF_ASSIGN_OR_RETURN(int ti, index(cs.tensor()));
    if (plan.given[ti] != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("leaving state of tensor '", tensors[ti].name, "' is given twice"));
    }
    if (!plan.in_call[ti]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "leaving state of tensor '", tensors[ti].name, "' is not among this call's tensors"));
    }
    plan.given[ti] = &cs;
  }
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    if (plan.in_call[ti]) ZF_RETURN_IF_ERROR(CheckLeavingState(tensors[ti], plan.given[ti]));
  }
  return plan;
}

HandOffLedger::HandOffLedger(int world, int tensors)
    : applied_(tensors, 0),
      per_tensor_(world, std::vector<int64_t>(tensors, 0)),
      rank_version_(world, 0) {}

std::vector<int64_t> HandOffLedger::Save() const {
  std::vector<int64_t> out(applied_);
  for (const auto& r : per_tensor_) out.insert(out.end(), r.begin(), r.end());
  out.insert(out.end(), rank_version_.begin(), rank_version_.end());
  return out;
}

bool HandOffLedger::Restore(const std::vector<int64_t>& flat) {
  const size_t tensors = applied_.size(), ranks = rank_version_.size();
  if (flat.size() != tensors + ranks * tensors + ranks) return false;
  size_t at = 0;
  for (auto& x : applied_) x = flat[at++];
  for (auto& r : per_tensor_) {
    for (auto& x : r) x = flat[at++];
  }
  for (auto& x : rank_version_) x = flat[at++];
  return true;
}

void HandOffLedger::Record(int rank, const std::vector<bool>& in_call, int64_t version) {
  bool all = true;
  for (size_t t = 0; t < in_call.size(); ++t) {
    if (in_call[t]) per_tensor_[rank][t] = version;
    all = all && per_tensor_[rank][t] == version;
  }
  if (all) rank_version_[rank] = version;
}

}  // namespace zenflow
