// The update of one closed round, as a function of the job's state: the
// mean of the round's sums (clipped if asked), one AdamW step on the
// daemon's columns of the tensor store (bias correction by each column's own
// count), the round's sums cleared, and the new values (or arithmetic
// deltas) encoded as ParameterDelta messages of at most max_shard_bytes
// (with the columns' state for the predicted step and the factored second
// moment for the local step, if asked). A
// round whose shards were non-finite, or whose mean cannot give a finite
// update, is skipped: the store is untouched and the sums are cleared.
//
//   UpdateLease lease = UpdateLease::Grant(round, &store, &accumulator);  // the owner, under its lock
//   RoundUpdateResult r = UpdateRound(input, std::move(lease));
//   for (v1::DownMessage& d : r.deltas) ...   // to every rank
//
// Runs without the owner's lock: the lease is its right to the buffers.
#ifndef ZENFLOW_SERVER_ROUND_UPDATE_H_
#define ZENFLOW_SERVER_ROUND_UPDATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/adamw.h"
#include "common/codec.h"
#include "common/thread_pool.h"
#include "server/round_accumulator.h"
#include "server/tensor_store.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

// What the update needs of a tensor (index = the store's tensor index).
struct RoundUpdateTensor {
  std::string name;
  int64_t rows = 0;
  DType param_dtype = DType::kF32;  // of the deltas (values kind)
};

// Exclusive use, for one round's update, of that round's accumulation
// buffer and of the daemon's (remote) columns' master, m, v and counts in
// the store. Move-only: exactly one update holds it. The owner of the
// buffers (Job) grants it, under its lock, once the round has fully closed,
// and keeps everything else off those buffers until the update finished:
// no shard is taken for the round that would reuse the buffer (round + 2),
// and a hand-off or reselection waits for every update to finish.
class UpdateLease {
 public:
  static UpdateLease Grant(int64_t round, TensorStore* store, RoundAccumulator* acc) {
    return UpdateLease(round, store, acc);
  }
  UpdateLease(UpdateLease&& other) noexcept
      : round_(other.round_), store_(other.store_), acc_(other.acc_) {
    other.store_ = nullptr;
    other.acc_ = nullptr;
  }
  UpdateLease& operator=(UpdateLease&&) = delete;
  UpdateLease(const UpdateLease&) = delete;
  UpdateLease& operator=(const UpdateLease&) = delete;

  int64_t round() const { return round_; }
  TensorStore* store() const { return store_; }       // null once moved from
  RoundAccumulator* acc() const { return acc_; }

 private:
  UpdateLease(int64_t round, TensorStore* store, RoundAccumulator* acc)
      : round_(round), store_(store), acc_(acc) {}
  int64_t round_;
  TensorStore* store_;
  RoundAccumulator* acc_;
};

struct RoundUpdateInput {
  int64_t round = 0;
  int64_t steps_sum = 0;   // rank-steps summed into the round (the mean's divisor)
  float lr = 0;            // the round's learning rate
  bool nonfinite = false;  // a shard carried NaN/Inf (skip_nonfinite_rounds)
  const std::vector<RoundUpdateTensor>* tensors = nullptr;
  // Per tensor: the daemon's columns this round, ascending.
  const std::vector<std::vector<int32_t>>* remote = nullptr;
  AdamWHyper hyper;  // its lr is replaced by `lr`
  float max_grad_norm = 0;  // 0: no clipping
  bool arithmetic = false;  // deltas as fp32 new - old instead of new values
  // The deltas also carry the columns' m and v (bf16) and update counts
  // after the update (ParameterDelta.m, v, update_counts), for the ranks'
  // predicted step; values kind only.
  bool moments = false;
  // The deltas also carry the factored second moment of each tensor's
  // columns after the update (ParameterDelta.row_v, col_v, v_mean), for the
  // ranks' local step (docs/design.md rule 13); values kind only.
  bool factored_moment = false;
  int64_t max_shard_bytes = 4 << 20;
  SimdLevel simd = SimdLevel::kScalar;
  ThreadPool* pool = nullptr;  // large updates are spread over it
};

struct RoundUpdateResult {
  bool skipped = false;     // nothing was updated
  bool overflowed = false;  // skipped because the sums were not finite
  float grad_norm = 0;      // of the round's mean gradient (before clipping)
  std::vector<v1::DownMessage> deltas;
};

// `lease` must be for in.round; the update ends it.
RoundUpdateResult UpdateRound(const RoundUpdateInput& in, UpdateLease lease);

// The delta messages a values-kind update of `round` sent, made again from
// the store's master as it is now (it must be as that update left it): the
// same messages, byte for byte. For a rank that lost them in a restart.
std::vector<v1::DownMessage> ValueDeltas(int64_t round, const std::vector<RoundUpdateTensor>& tensors,
                                         const std::vector<std::vector<int32_t>>& remote,
                                         TensorStore* store, int64_t max_shard_bytes,
                                         bool moments, bool factored_moment, float beta2);

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_ROUND_UPDATE_H_
