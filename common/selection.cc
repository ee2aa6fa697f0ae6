// Top-k column selection; see selection.h.
#include "common/selection.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace zenflow {

int64_t TopKCount(float k, int64_t cols) {
  if (cols <= 0 || !(k > 0.0f)) return 0;
  const double product = static_cast<double>(k) * static_cast<double>(cols);
  const double nearest = std::round(product);
  const double exact = std::fabs(product - nearest) <= 1e-6 ? nearest : product;
  const int64_t n = static_cast<int64_t>(std::ceil(exact));
  return std::min<int64_t>(std::max<int64_t>(n, 0), cols);
}

std::vector<int32_t> SelectTopK(const std::vector<float>& scores, int64_t n) {
  const int64_t size = static_cast<int64_t>(scores.size());
  n = std::min<int64_t>(std::max<int64_t>(n, 0), size);
  std::vector<int32_t> idx(scores.size());
  std::iota(idx.begin(), idx.end(), 0);
  auto better = [&scores](int32_t a, int32_t b) {
    if (scores[a] != scores[b]) return scores[a] > scores[b];
    return a < b;
  };
  if (n < size) {
    std::nth_element(idx.begin(), idx.begin() + n, idx.end(), better);
  }
  idx.resize(n);
  std::sort(idx.begin(), idx.end());
  return idx;
}

}  // namespace zenflow
