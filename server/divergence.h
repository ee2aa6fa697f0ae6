// The update divergence of a job's rounds (docs/design.md rule 14): how far
// a round's update of the daemon's columns is from what per-step AdamW
// would have done with the same gradients, estimated on a small sample of
// those columns.
//
// Every round samples about 1% of each tensor's daemon columns (at least
// one where the tensor has any), chosen from a hash of the job and the
// round, so the sample moves over the columns as rounds pass. The shards of
// the sampled columns are also kept per step (and per rank with rank-ordered
// sums) in a small side buffer. Before the round's update the sample's state
// (master, m, v, counts) is copied; after it, per-step AdamW is replayed on
// the copy, one step per step of the round with that step's mean gradient
// and the round's learning rate, and
//
//   divergence = ||applied - per-step|| / ||per-step||
//
// over the sample, where applied = new master - old master and per-step =
// replayed master - old master.
//
//   UpdateDivergence div(shapes, world, rank_ordered, interval, seed);
//   if (!div.Began(round)) div.BeginRound(round, remote);  // owner's lock
//   const int slot = div.Slot(t, round, c);                // per shard column
//   if (slot >= 0) div.Capture(slot, rank, round, k, [&](float* dst) { DecodeAdd(..., dst); });
//   ...
//   const bool on = div.Start(round, steps, store);        // the update's strand
//   UpdateRound(...);
//   std::optional<float> d = div.Finish(*store, hyper, clip, simd);
//
// Thread safety: BeginRound and Invalidate under the owner's lock with no
// capture in flight; Capture of different ranks may run at once (each rank
// owns its buffers when rank-ordered, shared buffers take a slot's lock);
// Start and Finish on the update's strand, holding the round's lease.
#ifndef ZENFLOW_SERVER_DIVERGENCE_H_
#define ZENFLOW_SERVER_DIVERGENCE_H_

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/adamw.h"
#include "server/tensor_store.h"

namespace zenflow {

class UpdateDivergence {
 public:
  // Rounds of more steps than this are not measured (the side buffer holds
  // this many steps at most).
  static constexpr int kMaxSteps = 16;
  // One sampled column in this many (at least one per tensor).
  static constexpr int64_t kSampleEvery = 100;

  // Sampled columns of a tensor with `cols` daemon columns.
  static int64_t SampleColumns(int64_t cols) {
    return cols <= 0 ? 0 : (cols + kSampleEvery - 1) / kSampleEvery;
  }
  // Bytes of the side buffers for a tensor of rows x cols (what the job's
  // footprint counts): two rounds of sampled columns x steps x sum buffers
  // of fp32, a received flag per sampled column, step and rank, and a slot
  // index per column.
  static int64_t BufferBytes(int64_t rows, int64_t cols, int64_t interval, int world,
                             bool rank_ordered);

  // A job's seed: FNV-1a of its id (the same in every build and run).
  static uint64_t SeedOf(const std::string& job_id) {
    uint64_t h = 1469598103934665603ull;
    for (unsigned char ch : job_id) h = (h ^ ch) * 1099511628211ull;
    return h;
  }

  // `interval`: the job's update_interval (S_max with auto); `seed`: what
  // the job's samples are drawn from (a hash of its id).
  UpdateDivergence(const std::vector<TensorStore::Shape>& shapes, int world, bool rank_ordered,
                   int64_t interval, uint64_t seed);
  UpdateDivergence(const UpdateDivergence&) = delete;
  UpdateDivergence& operator=(const UpdateDivergence&) = delete;

  // Whether round `round`'s sample was drawn (its buffer parity holds it).
  bool Began(int64_t round) const { return parity_[round & 1].round == round; }
  // Draws round `round`'s sample from each tensor's daemon columns
  // `remote[t]` (ascending) and clears its buffers.
  void BeginRound(int64_t round, const std::vector<std::vector<int32_t>>& remote);
  // Forgets both buffers' rounds (after a restore: what was captured before
  // it is gone, so those rounds are not measured).
  void Invalidate();

  // Column c of tensor t's slot in round `round`'s sample; -1 when it is
  // not sampled (or the round's sample was not drawn).
  int Slot(int t, int64_t round, int32_t c) const {
    const Parity& p = parity_[round & 1];
    if (p.round != round) return -1;
    return p.slot_of[t].empty() ? -1 : p.slot_of[t][c];
  }
  // Rank `rank`'s values of step k of the round (0-based in the round) for
  // a sampled slot: `add(dst)` adds them to dst (rows floats). Steps beyond
  // kMaxSteps are not kept.
  template <typename AddFn>
  void Capture(int slot, int rank, int64_t round, int64_t k, AddFn&& add) {
    if (k < 0 || k >= steps_) return;
    Parity& p = parity_[round & 1];
    float* dst = p.values.data() + ValueAt(p, slot, rank, k);
    if (sum_ranks_ > 1 || world_ == 1) {
      add(dst);  // the rank's own buffer
    } else {
      std::lock_guard<std::mutex> lock(slot_mu_[static_cast<size_t>(slot) % slot_mu_.size()]);
      add(dst);
    }
    p.received[(static_cast<size_t>(slot) * steps_ + static_cast<size_t>(k)) * world_ + rank] = 1;
  }

  // Before round `round`'s update (of `steps` steps): copies the sample's
  // state from `store`. False (nothing to measure) unless every sampled
  // column's every step arrived from every rank.
  bool Start(int64_t round, int32_t steps, TensorStore* store);  // reads only
  // After the update: replays per-step AdamW (hyper, its lr the round's;
  // each step's mean gradient times `clip`, the round's clipping factor) on
  // the copy Start made and compares. Empty when Start returned false or
  // the replay moved nothing.
  std::optional<float> Finish(const TensorStore& store, const AdamWHyper& hyper, float clip,
                              SimdLevel simd);

  // Sampled columns of round `round` (for tests): {tensor, column}.
  std::vector<std::pair<int, int32_t>> SampleOf(int64_t round) const;

 private:
  struct Sampled {
    int tensor;
    int32_t col;
    int64_t rows;
    size_t offset;  // of its values in Parity::values
  };
  struct Parity {
    int64_t round = -1;
    std::vector<std::vector<int32_t>> slot_of;  // [tensor][col]: slot or -1
    std::vector<Sampled> slots;
    std::vector<float> values;      // per slot: [step][sum rank][rows]
    std::vector<uint8_t> received;  // [slot][step][rank]
  };
  size_t ValueAt(const Parity& p, int slot, int rank, int64_t k) const {
    const Sampled& s = p.slots[slot];
    const int r = sum_ranks_ > 1 ? rank : 0;
    return s.offset + static_cast<size_t>((k * sum_ranks_ + r) * s.rows);
  }

  const std::vector<TensorStore::Shape> shapes_;
  const int world_;
  const int sum_ranks_;
  const int64_t steps_;  // steps kept per round: min(interval, kMaxSteps)
  const uint64_t seed_;
  std::array<Parity, 2> parity_;
  std::array<std::mutex, 16> slot_mu_;

  // The round being measured (Start to Finish): the sample's state before
  // the update, as copied.
  const Parity* measured_ = nullptr;
  int32_t measured_steps_ = 0;
  std::vector<float> old_master_, shadow_master_, shadow_m_, shadow_v_, grad_;
  std::vector<int64_t> old_count_;
};

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_DIVERGENCE_H_
