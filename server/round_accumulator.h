// The rounds of one job as they arrive: per-round fp32 sums of the shards of
// every rank and step (two buffers, by round parity, so that round r+1
// accumulates while round r is updated), and which rank has sent which
// column for which step of its open round (RankArrivals).
//
//   RoundAccumulator acc({{rows, cols}}, /*world=*/2, /*rank_ordered=*/true);
//   if (!acc.Received(t, rank, step, c)) {
//     DecodeAdd(dtype, payload, rows, acc.sum_of(t, rank, round, c));
//     acc.MarkReceived(t, rank, step, c);
//   }
//   ...  // ranks 0..r closed the round: theirs folded, in rank order
//   acc.FoldRanks(simd, round, 1, r + 1);  // once all are: acc.sum(t, round, c) is the total
//
// Floating-point addition is not associative: one buffer that every rank
// adds into holds a sum that depends on the order the ranks' shards arrived
// in. Rank-ordered sums give each rank beyond the first its own buffers and
// add them to rank 0's in rank order (FoldRanks, as the ranks close: rank r
// once ranks 0..r have all closed), so the total depends only on what each
// rank sent: reruns, and runs that ride through a daemon restart, are
// bit-identical. A rank's own steps always arrive in order.
//
// Sums are not zeroed between rounds where each rank adds into a buffer of
// its own (rank-ordered sums, or a one-rank job: first_add_stores()): a
// rank's first shard of a round for a column STORES (DecodeAdd's `first`,
// when no step of the rank's open round has that column: !Seen()), so a buffer's stale values from two
// rounds before are never read, and neither the fold nor the update
// writes zeros. Every column a round's update or fold reads was stored
// first: a rank closes a round only with every column of every step
// (RankArrivals), and a round's buffer is reused only after its update
// (Job::CheckRoundBuffer). Shared sums (one buffer that the ranks add into
// concurrently) are zeroed after the update, as before (Clear).
//
// Not thread-safe: its owner (Job) serializes access, under its mutex, or by
// the ownership a round's update has of that round's buffer.
#ifndef ZENFLOW_SERVER_ROUND_ACCUMULATOR_H_
#define ZENFLOW_SERVER_ROUND_ACCUMULATOR_H_

#include <array>
#include <cstdint>
#include <vector>

#include "common/adamw.h"
#include "server/rank_arrivals.h"
#include "server/tensor_store.h"

namespace zenflow {

// What FoldSquares gives of a block of a round's total.
struct BlockSquares {
  double sum = 0;     // sum of the squares, in double (order: FoldSquares)
  float largest = 0;  // the largest magnitude (when every value is finite)
};

// Elements FoldSquares spreads the squares over: element i of a block adds
// into lane i % kSquareLanes, each lane in element order.
inline constexpr int kSquareLanes = 32;

// The fold and the norm's pass in one: for each i in [0, n),
//   total[i] = (...((total[i] + parts[0][i]) + parts[1][i]) + ...)  (float,
// in the order of parts: rank order; the parts only read), and of
// the new total[i] the square summed in double (double(x) * double(x) is
// exact, so a fused multiply-add gives the same bits) into lane
// i % kSquareLanes, the lanes then added 0, 1, ..., 31; and the largest
// |total[i]|. Every level gives the same bits (`level` must be supported).
BlockSquares FoldSquares(SimdLevel level, float* total, float* const* parts, int nparts, size_t n);

// The fold alone, in one pass: for each i in [0, n),
//   total[i] = (...((total[i] + parts[0][i]) + parts[1][i]) + ...)
// (FoldSquares' adds, the same bits at every level); the parts are only
// read. Vectorized at `level` (which must be supported).
void FoldParts(SimdLevel level, float* total, float* const* parts, int nparts, size_t n);

class RoundAccumulator {
 public:
  // Zeroed sums; nothing received. Allocates 8 B per element (times
  // `world` when rank_ordered) and RankArrivals' bookkeeping (per column and
  // per rank, never per rank and column); throws std::bad_alloc when it
  // cannot.
  RoundAccumulator(const std::vector<TensorStore::Shape>& shapes, int world, bool rank_ordered);
  RoundAccumulator(const RoundAccumulator&) = delete;
  RoundAccumulator& operator=(const RoundAccumulator&) = delete;

  // How many sum buffers a round has: `world` when rank-ordered, else 1.
  int sum_ranks() const { return sum_ranks_; }
  // Each rank adds into a buffer of its own (rank-ordered sums, or one
  // rank): its first add of a round into a column stores (!Seen()), and
  // nothing zeroes the sums between rounds (see the top of this file).
  bool first_add_stores() const { return sum_ranks_ > 1 || world_ == 1; }

  // Column c of tensor t in round `round`'s sum (rows floats, followed by
  // column c + 1's): after Fold, the total of every rank.
  float* sum(int t, int64_t round, int64_t c) { return sum_of(t, 0, round, c); }
  // Where `rank`'s shards of column c are added.
  float* sum_of(int t, int rank, int64_t round, int64_t c) {
    Tensor& x = tensors_[t];
    return x.sum[rank < sum_ranks_ ? rank : 0][round & 1].data() + c * x.shape.rows;
  }
  // Adds the sums of ranks [first_rank, end_rank) (first_rank >= 1) of
  // every tensor to rank 0's, in rank order: the same adds, in the same
  // order, as folding them all at once. Each rank is folded once a round
  // (its part is left as it was). Nothing to do unless rank-ordered.
  void FoldRanks(SimdLevel level, int64_t round, int first_rank, int end_rank);
  // Adds the other ranks' sums of columns [first, first + n) to rank 0's, in
  // rank order. Nothing to do unless rank-ordered.
  void Fold(SimdLevel level, int t, int64_t round, int64_t first, int64_t n);
  // The squares of the total (FoldSquares) in the same pass as the fold of
  // ranks [first_rank, sum_ranks()) (those before it already folded: with
  // first_rank == sum_ranks(), the squares alone).
  BlockSquares FoldNorm(SimdLevel level, int t, int64_t round, int64_t first, int64_t n,
                        int first_rank = 1);
  // Zeroes columns [first, first + n) of round `round`'s shared sums after
  // its update; nothing where the first adds store (first_add_stores()).
  void Clear(int t, int64_t round, int64_t first, int64_t n);

  // Whether `rank` already sent column c of tensor t for `step`.
  bool Received(int t, int rank, int64_t step, int32_t c) const {
    return arrivals_.Received(t, rank, step, c);
  }
  // Records it: one more step of the rank's open round for that column.
  void MarkReceived(int t, int rank, int64_t step, int32_t c) {
    arrivals_.MarkReceived(t, rank, step, c);
  }
  // Steps of the rank's open round received for column c of tensor t.
  int32_t hits(int t, int rank, int32_t c) const { return arrivals_.hits(t, rank, c); }
  // Whether any step of the rank's open round has column c of tensor t
  // (hits() > 0, without counting them all).
  bool Seen(int t, int rank, int32_t c) const { return arrivals_.Seen(t, rank, c); }
  // The rank closed its round: its counts start again from zero.
  void ResetRank(int rank) { arrivals_.ResetRank(rank); }
  // Which rank sent which column (the selection set on it, checkpoints).
  RankArrivals& arrivals() { return arrivals_; }
  const RankArrivals& arrivals() const { return arrivals_; }

  // For checkpoints: tensor t's sum buffer `r` (< sum_ranks()) of the
  // rounds of `parity` (rows * cols floats).
  std::vector<float>& sum_buffer(int t, int r, int parity) { return tensors_[t].sum[r][parity & 1]; }

  // Before the parameters are uploaded the odd rounds' sum is idle: an
  // upload stages tensor t there (row-major), then clears it.
  float* staging(int t) { return tensors_[t].sum[0][1].data(); }
  void ClearStaging(int t, int64_t elements);

 private:
  // The most ranks' parts one pass of a fold reads at once.
  static constexpr int kMaxFoldParts = 64;
  // Adds ranks [first_rank, end_rank)'s sums of the len values from column
  // `first` of tensor t to rank 0's, in rank order.
  void FoldInto(SimdLevel level, int t, int64_t round, int64_t first, size_t len, int first_rank,
                int end_rank);

  struct Tensor {
    TensorStore::Shape shape;
    std::vector<std::array<std::vector<float>, 2>> sum;  // [rank][parity]
  };
  int sum_ranks_ = 1;
  int world_ = 1;
  std::vector<Tensor> tensors_;
  RankArrivals arrivals_;
};

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_ROUND_ACCUMULATOR_H_
