// A job's rounds as they arrive; see round_accumulator.h.
#include "server/round_accumulator.h"

#include <algorithm>
#include <cstring>

namespace zenflow {

RoundAccumulator::RoundAccumulator(const std::vector<TensorStore::Shape>& shapes, int world,
                                   bool rank_ordered)
    : sum_ranks_(rank_ordered ? world : 1), tensors_(shapes.size()) {
  for (size_t i = 0; i < shapes.size(); ++i) {
    Tensor& x = tensors_[i];
    x.shape = shapes[i];
    const size_t n = static_cast<size_t>(x.shape.rows * x.shape.cols);
    x.sum.resize(sum_ranks_);
    for (auto& parities : x.sum) {
      parities[0].assign(n, 0.0f);
      parities[1].assign(n, 0.0f);
    }
    x.last_step.assign(world, std::vector<int64_t>(x.shape.cols, -1));
    x.hits.assign(world, std::vector<int32_t>(x.shape.cols, 0));
  }
}

void RoundAccumulator::Fold(int t, int64_t round, int64_t first, int64_t n) {
  Tensor& x = tensors_[t];
  const size_t len = static_cast<size_t>(n * x.shape.rows);
  float* total = sum(t, round, first);
  for (int r = 1; r < sum_ranks_; ++r) {
    float* part = sum_of(t, r, round, first);
    for (size_t i = 0; i < len; ++i) total[i] += part[i];
    std::memset(part, 0, len * sizeof(float));
  }
}

void RoundAccumulator::Clear(int t, int64_t round, int64_t first, int64_t n) {
  for (int r = 0; r < sum_ranks_; ++r) {
    std::memset(sum_of(t, r, round, first), 0,
                static_cast<size_t>(n * tensors_[t].shape.rows) * sizeof(float));
  }
}

void RoundAccumulator::ResetRank(int rank) {
  for (Tensor& x : tensors_) std::fill(x.hits[rank].begin(), x.hits[rank].end(), 0);
}

void RoundAccumulator::ClearStaging(int t, int64_t elements) {
  std::vector<float>& s = tensors_[t].sum[0][1];
  std::fill(s.begin(), s.begin() + std::min<int64_t>(elements, static_cast<int64_t>(s.size())),
            0.0f);
}

}  // namespace zenflow
