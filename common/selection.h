// Top-k column selection shared by the daemon and the worker (docs/design.md rule 3).
//
//   int n = TopKCount(0.1f, 4096);                 // 410
//   std::vector<int32_t> cols = SelectTopK(scores, n);  // ascending indices
#ifndef ZENFLOW_COMMON_SELECTION_H_
#define ZENFLOW_COMMON_SELECTION_H_

#include <cstdint>
#include <vector>

namespace zenflow {

// Number of important columns for ratio k of `cols` columns: ceil(k * cols),
// where k*cols is computed in double and a product within 1e-6 of an integer
// counts as that integer (so k = 0.1f of 10 columns is 1, not 2).
// Clamped to [0, cols].
int64_t TopKCount(float k, int64_t cols);

// The n columns with the largest scores, ties broken toward the lower index,
// returned in ascending index order. Deterministic. n is clamped to
// [0, scores.size()].
std::vector<int32_t> SelectTopK(const std::vector<float>& scores, int64_t n);

}  // namespace zenflow

#endif  // ZENFLOW_COMMON_SELECTION_H_
