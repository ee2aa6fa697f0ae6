// The median of a benchmark's samples (the mean of the middle two for an
// even count; 0 for none).
#ifndef ZENFLOW_TOOLS_BENCH_MEDIAN_H_
#define ZENFLOW_TOOLS_BENCH_MEDIAN_H_

#include <algorithm>
#include <vector>

namespace zenflow {

inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace zenflow

#endif  // ZENFLOW_TOOLS_BENCH_MEDIAN_H_
