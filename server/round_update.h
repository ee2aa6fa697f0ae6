// The update of one closed round, as a function of the job's state: the
// mean of the round's sums (clipped if asked), one AdamW step on the
// daemon's columns of the tensor store (bias correction by each column's own
// count), the round's shared sums cleared (RoundAccumulator::Clear: per-rank
// sums are not, their next first adds store), and the new values (or arithmetic
// deltas) encoded as ParameterDelta messages of at most max_shard_bytes
// (with the columns' state for the predicted step and the factored second
// moment for the local step, if asked). A
// round whose shards were non-finite, or whose mean cannot give a finite
// update, is skipped: the store is untouched and the sums are cleared as
// above.
//
//   UpdateLease lease = UpdateLease::Grant(round, &store, &accumulator);  // the owner, under its lock
//   input.sink = [&](v1::DownMessage d) { ... };  // to every rank, in order
//   RoundUpdateResult r = UpdateRound(input, std::move(lease));
// (without a sink the messages are returned in r.deltas)
//
// Runs without the owner's lock: the lease is its right to the buffers.
//
// Two passes over the round's values, each spread over the pool's threads
// in blocks of at most kUpdateBlockElements that the threads claim as they
// go (ThreadPool::ForEach: no thread idles while blocks are left), with one
// barrier between them, which the norm makes inherent (the clip factor and
// whether the round can update finitely must be known before any AdamW):
//   1. per block, the squares and largest magnitude of the total (with
//      rank-ordered sums the daemon folded the ranks' sums into rank 0's as
//      they closed: folded_ranks; any rank not yet folded is folded here,
//      in rank order, in the same read: FoldSquares); beside the blocks,
//      the first batch of delta messages is made and sized (their fields,
//      columns and counts set, payloads allocated);
//   2. batch by batch (consecutive messages of at most window_bytes), per
//      block, while it is in cache: AdamW, the values (or fp32 new - old)
//      and with moments m and v encoded straight into their message's
//      payload, the shared sum zeroed, the counts advanced; beside the blocks, the
//      next batch's messages are made; then the batch's messages go to the
//      sink (the ranks' outboxes), so a round's deltas are never all held
//      by the update.
// The factored moment (when asked) then reads v once more (its row sums
// run over all columns in a fixed order: factored_moment.h) and is added
// to every message, which are all held until then.
// The norm is the sum of the blocks' FoldSquares sums in block order, the
// blocks are fixed by the columns, counts and messages (never by the
// threads): the result does not depend on the thread count or on which
// thread ran which block.
#ifndef ZENFLOW_SERVER_ROUND_UPDATE_H_
#define ZENFLOW_SERVER_ROUND_UPDATE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/adamw.h"
#include "common/codec.h"
#include "common/geometry.h"
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

class DeltaRecycler;  // server/delta_recycler.h

struct RoundUpdateInput {
  int64_t round = 0;
  int64_t steps_sum = 0;   // rank-steps summed into the round (the mean's divisor)
  float lr = 0;            // the round's learning rate
  bool nonfinite = false;  // a shard carried NaN/Inf (skip_nonfinite_rounds)
  // Every value summed into the round was below 2^63 in magnitude (proven
  // as the shards came in: Job::AddShard). Then the mean gradient of at most
  // steps_sum such values is below 2^63 too, and its square and the norm's
  // sum are finite: the round cannot overflow. Without clipping
  // (max_grad_norm 0, the default) nothing then needs the norm before AdamW,
  // and the update is one pass: per block the fold and the squares, then
  // AdamW, the encode and (shared sums) the clear while the block is in cache. Otherwise
  // (or false: not known) the first pass reads the whole round's sums for
  // the norm and the overflow check before the second runs AdamW. The two
  // give the same bits.
  bool bounded = false;
  // Rank-ordered sums: ranks [0, folded_ranks) are already in rank 0's sum
  // (the owner folds them as they close: RoundAccumulator::FoldRanks); the
  // update folds the rest, in its first pass.
  int folded_ranks = 1;
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
  uint32_t adam8_draw_seed = 0;  // JobContext::adam8_draw_seed
  ThreadPool* pool = nullptr;  // large updates are spread over it
  // The messages are made and encoded in batches of consecutive messages
  // of at most window_bytes (payload, m and v; at least one message each):
  // at most two batches are held at once (one encoded, the next made).
  int64_t window_bytes = kDeltaWindowBytes;
  // When set, each message is handed to it, in order, as soon as its batch
  // is encoded (the result's deltas stay empty): a round's messages are
  // never all held by the update. With the factored moment, which needs
  // every column's v after the update, they are handed over at the end.
  std::function<void(v1::DownMessage)> sink;
  // When set, the messages' payloads (and m, v) are sized from its buffers,
  // which the ranks' outboxes gave back from earlier messages
  // (delta_recycler.h): no zero-fill, no fresh pages.
  DeltaRecycler* recycler = nullptr;
};

struct RoundUpdateResult {
  bool skipped = false;     // nothing was updated
  bool overflowed = false;  // skipped because the sums were not finite
  float grad_norm = 0;      // of the round's mean gradient (before clipping)
  bool two_pass = false;    // the norm came first, in a pass of its own (not bounded)
  int64_t messages = 0;     // the delta messages made (into deltas, or to the sink)
  std::vector<v1::DownMessage> deltas;  // empty with a sink
};

// `lease` must be for in.round; the update ends it.
RoundUpdateResult UpdateRound(const RoundUpdateInput& in, UpdateLease lease);

// Largest block of the update's passes (elements): its sum, master, m and
// v stay in L2 between the AdamW and the encode.
inline constexpr int64_t kUpdateBlockElements = int64_t{1} << 14;

// The kernels every round update must run over its values, and nothing
// else: for the ceiling a benchmark compares the measured update with
// (round_update_fraction = RunRoundUpdateKernels' time over the round's
// number of values on the update pool / UpdateRound's, or the daemon's
// JobStats.round_update_seconds). UpdateRound's second pass runs the same
// code per block (plus the zeroing of shared sums and the counts).
struct RoundKernelOptions {
  SimdLevel simd = SimdLevel::kScalar;
  AdamWHyper hyper;
  int64_t step = 1;        // the update count AdamW corrects for
  float grad_scale = 1.0f;  // 1 / rank-steps, times the clip factor
  DType values = DType::kF32;  // the deltas' dtype (values kind)
  bool arithmetic = false;  // fp32 new - old instead of the values
  bool moments = false;     // m and v encoded too (bf16)
  uint32_t adam8_draw_seed = 0;  // Adam8Update's draw_seed (8-bit state only)
};
struct RoundKernelBuffers {
  const float* grad = nullptr;
  float* master = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  size_t n = 0;
  // n * DTypeSize(values) bytes (4 * n with arithmetic); with moments,
  // m_out and v_out n * 2 bytes each (else unused).
  void* values_out = nullptr;
  void* m_out = nullptr;
  void* v_out = nullptr;
};
// AdamW over the n values and the encode of the values (and m, v) into the
// outputs, in blocks of kUpdateBlockElements spread over `pool` as
// UpdateRound spreads them (null pool: on the caller).
void RunRoundUpdateKernels(const RoundKernelOptions& o, const RoundKernelBuffers& b,
                           ThreadPool* pool);

// The delta messages a values-kind update of `round` sent, made again from
// the store's master as it is now (it must be as that update left it): the
// same messages, byte for byte. For a rank that lost them in a restart.
std::vector<v1::DownMessage> ValueDeltas(int64_t round, const std::vector<RoundUpdateTensor>& tensors,
                                         const std::vector<std::vector<int32_t>>& remote,
                                         TensorStore* store, int64_t max_shard_bytes,
                                         bool moments, bool factored_moment, float beta2);

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_ROUND_UPDATE_H_
