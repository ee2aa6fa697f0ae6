// The selection rendezvous of one job (docs/design.md rules 2-3, 8): every rank's
// per-column importance for one round-boundary step, the calls waiting for
// the selection, and the payload they hold. Job decides when the selection
// can be made (every rank submitted, every closed round updated) and makes
// it from SummedScores(); this class only keeps the rendezvous straight:
// a retry replaces its rank's earlier call, a withdrawn (cancelled) call
// leaves nothing behind, and a step with nobody waiting is forgotten.
//
//   SelectionBarrier b(/*world=*/2);
//   if (auto old = b.Submit(rank, step, scores, call, done)) old(Replaced(...));
//   if (b.all_submitted()) { auto sums = b.SummedScores(n); ... for (auto& w : b.Take()) w(sel); }
//
// Not thread-safe: its owner (Job) serializes access under its mutex.
#ifndef ZENFLOW_SERVER_SELECTION_BARRIER_H_
#define ZENFLOW_SERVER_SELECTION_BARRIER_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

class SelectionBarrier {
 public:
  using Done = std::function<void(absl::StatusOr<v1::Selection>)>;

  explicit SelectionBarrier(int world) : world_(world) {}

  // The step being gathered; -1 when none.
  int64_t step() const { return step_; }
  bool submitted(int rank) const { return step_ >= 0 && submitted_[rank]; }
  bool all_submitted() const;
  // Score bytes held by the waiting calls.
  int64_t bytes() const { return bytes_; }

  // Records `rank`'s scores (per tensor; empty for tensors without) for
  // `step`, which must be step() when one is being gathered. Returns the
  // callback of the rank's earlier call that this one replaces, or null.
  Done Submit(int rank, int64_t step, std::vector<std::vector<float>> scores, uint64_t call,
              Done done);
  // Drops `rank`'s call `call` (a no-op if the rank has another call, or
  // none); with nobody left waiting, the step is forgotten.
  void Withdraw(int rank, uint64_t call);
  // Tensor t's scores summed over ranks in rank order (deterministic);
  // `cols` zeros for a tensor no rank scored.
  std::vector<float> SummedScores(int t, int64_t cols) const;
  // Ends the rendezvous: the waiting callbacks, in rank order; resets.
  std::vector<Done> Take();

 private:
  void Reset();

  const int world_;
  int64_t step_ = -1;
  std::vector<bool> submitted_;
  std::vector<std::vector<std::vector<float>>> scores_;  // [rank][tensor][col]
  std::vector<Done> waiters_;
  std::vector<uint64_t> calls_;
  int64_t bytes_ = 0;
};

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_SELECTION_BARRIER_H_
