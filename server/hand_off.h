// The hand-off of a reselection (docs/design.md rule 8): the columns that change
// hands between two selections, the check of one HandOff call against the
// job's tensors, and the ledger of who has handed off what. The first
// rank's leaving state of a tensor is applied to the daemon's store; the
// other ranks' must equal it (they ran the same updates).
//
//   ColumnsChangingHands(prev, cur, &t.leaving, &t.joining);
//   ZF_ASSIGN_OR_RETURN(HandOffPlan plan, PlanHandOff(req, tensors, index));
//   if (!ledger.applied(ti, version)) { store.WriteColumns(ti, *plan.given[ti]); ledger.MarkApplied(ti, version); }
//   ledger.Record(rank, plan.in_call, version);
//
// Not thread-safe: its owner (Job) serializes access under its mutex.
#ifndef ZENFLOW_SERVER_HAND_OFF_H_
#define ZENFLOW_SERVER_HAND_OFF_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

// Columns that were important and are not any more (`leaving`: the ranks
// hand their state to the daemon) and the reverse (`joining`: the daemon
// hands its state to the ranks). Inputs and outputs ascending.
void ColumnsChangingHands(const std::vector<int32_t>& before, const std::vector<int32_t>& after,
                          std::vector<int32_t>* leaving, std::vector<int32_t>* joining);

// What a hand-off needs of one tensor.
struct HandOffTensor {
  std::string name;
  int64_t rows = 0;
  std::vector<int32_t> leaving, joining;
};

// One HandOff call, checked: the tensors it covers (all when it names
// none) and, per covered tensor with leaving columns, its state (pointing
// into the request).
struct HandOffPlan {
  std::vector<bool> in_call;
  std::vector<const v1::ColumnState*> given;
};

// INVALID_ARGUMENT naming the tensor unless the call names each tensor at
// most once, gives each covered tensor's leaving state exactly once (and
// none for others), for exactly its leaving columns, with rows values, m
// and v per column, all finite, and non-negative update counts. `index`
// maps a tensor name to its position (NOT_FOUND otherwise).
absl::StatusOr<HandOffPlan> PlanHandOff(
    const v1::HandOffRequest& req, const std::vector<HandOffTensor>& tensors,
    const std::function<absl::StatusOr<int>(const std::string&)>& index);

// Which selection version's leaving state each tensor holds, and which
// version each rank has completely handed off.
class HandOffLedger {
 public:
  HandOffLedger(int world, int tensors);

  // Tensor t holds the leaving state of `version` (the first rank's).
  bool applied(int t, int64_t version) const { return applied_[t] == version; }
  void MarkApplied(int t, int64_t version) { applied_[t] = version; }
  // `rank` handed off the tensors in `in_call` for `version`.
  void Record(int rank, const std::vector<bool>& in_call, int64_t version);
  // The last version whose state `rank` handed off for every tensor (0:
  // none; the initial selection needs no hand-off).
  int64_t rank_version(int rank) const { return rank_version_[rank]; }

  // For checkpoints: every figure, flat (tensors, then ranks x tensors,
  // then ranks), and back. Restore fails unless the sizes match.
  std::vector<int64_t> Save() const;
  bool Restore(const std::vector<int64_t>& flat);

 private:
  std::vector<int64_t> applied_;                  // by tensor
  std::vector<std::vector<int64_t>> per_tensor_;  // [rank][tensor]
  std::vector<int64_t> rank_version_;             // by rank
};

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_HAND_OFF_H_
