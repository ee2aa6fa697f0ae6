// The factored second moment a round's deltas carry for the ranks' local
// step (docs/design.md rule 13; ParameterDelta.row_v, col_v, v_mean): per
// tensor, the bias-corrected v of the daemon's columns reduced to its row
// means, its column means and its overall mean, O(rows + cols) floats, from
// which a rank estimates vh[i, j] as row_v[i] * col_v[j] / v_mean.
//
//   std::vector<FactoredMoment> f = ComputeFactoredMoments(tensors, beta2, parallel);
//   delta.mutable_row_v()->Add(f[t].row_v.begin(), f[t].row_v.end());
//
// With vh = v * (1 / (1 - beta2^count)) per column (count: the column's
// update count, the bias correction in double as AdamW's), every sum is
// taken in double in a fixed order, so the result does not depend on how
// the work is spread over threads: a row's sum runs over its columns in
// ascending order; a column's over blocks of kFactoredRowBlock rows, the
// blocks' sums added in order, each block's the pairwise sum
// ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)) of eight lanes, lane l
// summing the block's rows r with r % 8 == l in row order; the total over
// the columns' sums in ascending order. Means are those sums divided by
// the count of their terms, rounded to float at the end.
#ifndef ZENFLOW_SERVER_FACTORED_MOMENT_H_
#define ZENFLOW_SERVER_FACTORED_MOMENT_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "common/geometry.h"

namespace zenflow {

// Rows a task of ComputeFactoredMoments covers: tensors, and blocks of a
// tensor's rows, spread over the threads. A column's sum is split at these
// boundaries. Its scratch is one double per row and one per column and
// block of rows: under 1/5000 of the tensor's master, m and v. (Smaller
// blocks spread a single tensor wider but read v in shorter runs: 512 rows
// made the pass twice as slow on one thread.)
inline constexpr int64_t kFactoredRowBlock = 4096;

// One tensor's daemon columns, as ComputeFactoredMoments reads them.
struct FactoredMomentTensor {
  int64_t rows = 0;
  const std::vector<int32_t>* columns = nullptr;  // the daemon's columns, ascending
  // Column c's v (rows values) and update count after the round's update.
  std::function<const float*(int32_t c)> v;
  std::function<int64_t(int32_t c)> count;
};

struct FactoredMoment {
  std::vector<float> row_v;  // rows values (empty when the tensor has no columns)
  std::vector<float> col_v;  // one per entry of columns
  float v_mean = 0;
};

// Runs fn over [0, n) in pieces, possibly on several threads.
using ParallelRange = std::function<void(size_t n, const std::function<void(size_t, size_t)>& fn)>;

// One FactoredMoment per tensor (all of their blocks spread over `parallel`).
// Reads each v once.
std::vector<FactoredMoment> ComputeFactoredMoments(const std::vector<FactoredMomentTensor>& tensors,
                                                   float beta2, const ParallelRange& parallel);

// Bytes a delta message of `columns` columns of a tensor of `rows` rows
// spends on the factored moment: row_v, col_v and v_mean (protobuf packs
// them as 4-byte floats; their tags and lengths are left to the headroom
// under the message size limit).
inline int64_t FactoredMomentBytes(int64_t rows, int64_t columns) {
  return 4 * (rows + columns + 1);
}

// Whole columns of `rows` values of `value_bytes` each that fit in a delta
// message of `max_bytes`, when it also carries the factored moment
// (`factored`) or not; at least 1.
inline int64_t DeltaColumnsPerMessage(int64_t max_bytes, int64_t rows, int64_t value_bytes,
                                      bool factored) {
  if (!factored) return ColumnsPerMessage(max_bytes, rows, value_bytes);
  const int64_t room = max_bytes - FactoredMomentBytes(rows, 0);
  const int64_t col = std::max<int64_t>(1, rows * value_bytes + 4);
  return std::max<int64_t>(1, room / col);
}

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_FACTORED_MOMENT_H_
