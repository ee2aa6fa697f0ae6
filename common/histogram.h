// Observations counted into fixed buckets, exported as a v1.Histogram (the
// daemon's latency and stall figures in GetStats and /metrics).
//
//   HistogramCounts h(kSecondsBuckets);
//   h.Observe(0.012);
//   h.Export(stats->mutable_round_update_seconds());
//
// Not thread-safe: its owner serializes access.
#ifndef ZENFLOW_COMMON_HISTOGRAM_H_
#define ZENFLOW_COMMON_HISTOGRAM_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

// Round update and accumulation times, seconds.
inline const std::vector<double>& RoundSecondsBuckets() {
  static const std::vector<double> b = {.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10};
  return b;
}
// A worker step's stall, seconds.
inline const std::vector<double>& StallSecondsBuckets() {
  static const std::vector<double> b = {.0001, .0005, .001, .005, .01, .05, .1, .5, 1, 5};
  return b;
}

class HistogramCounts {
 public:
  // `bounds` ascending.
  explicit HistogramCounts(const std::vector<double>& bounds)
      : bounds_(bounds), counts_(bounds.size() + 1, 0) {}

  void Observe(double v) {
    const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
    ++counts_[i];
    sum_ += v;
    ++count_;
  }
  void Export(v1::Histogram* out) const {
    out->Clear();
    out->mutable_upper_bounds()->Add(bounds_.begin(), bounds_.end());
    out->mutable_counts()->Add(counts_.begin(), counts_.end());
    out->set_sum(sum_);
    out->set_count(count_);
  }

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // one per bound, then one above them all
  double sum_ = 0;
  int64_t count_ = 0;
};

}  // namespace zenflow

#endif  // ZENFLOW_COMMON_HISTOGRAM_H_
