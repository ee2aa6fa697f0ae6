// The update divergence of a job's rounds; see divergence.h.
#include "server/divergence.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/random.h"

namespace zenflow {

int64_t UpdateDivergence::BufferBytes(int64_t rows, int64_t cols, int64_t interval, int world,
                                      bool rank_ordered) {
  const int64_t steps = std::min<int64_t>(std::max<int64_t>(interval, 1), kMaxSteps);
  const int64_t sums = rank_ordered ? world : 1;
  const int64_t sampled = SampleColumns(cols);
  const int64_t values = sampled * rows * steps * sums * static_cast<int64_t>(sizeof(float));
  const int64_t flags = sampled * steps * world;
  const int64_t index = cols * static_cast<int64_t>(sizeof(int32_t));
  // Two rounds' buffers, and the update's copy of the sample's state (master
  // before and after, m, v, one step's gradient: at most 5 floats per value).
  return 2 * (values + flags + index) + sampled * rows * 5 * static_cast<int64_t>(sizeof(float));
}

UpdateDivergence::UpdateDivergence(const std::vector<TensorStore::Shape>& shapes, int world,
                                   bool rank_ordered, int64_t interval, uint64_t seed)
    : shapes_(shapes),
      world_(world),
      sum_ranks_(rank_ordered ? world : 1),
      steps_(std::min<int64_t>(std::max<int64_t>(interval, 1), kMaxSteps)),
      seed_(seed) {
  size_t values = 0, flags = 0;
  for (const TensorStore::Shape& s : shapes_) {
    const int64_t n = SampleColumns(s.cols);
    values += static_cast<size_t>(n * s.rows * steps_ * sum_ranks_);
    flags += static_cast<size_t>(n * steps_ * world_);
  }
  for (Parity& p : parity_) {
    p.slot_of.resize(shapes_.size());
    for (size_t t = 0; t < shapes_.size(); ++t) p.slot_of[t].assign(shapes_[t].cols, -1);
    p.values.assign(values, 0.0f);
    p.received.assign(flags, 0);
  }
}

void UpdateDivergence::BeginRound(int64_t round, const std::vector<std::vector<int32_t>>& remote) {
  Parity& p = parity_[round & 1];
  for (const Sampled& s : p.slots) p.slot_of[s.tensor][s.col] = -1;
  p.slots.clear();
  p.round = round;
  size_t offset = 0;
  for (size_t t = 0; t < shapes_.size() && t < remote.size(); ++t) {
    const std::vector<int32_t>& cols = remote[t];
    const int64_t m = static_cast<int64_t>(cols.size());
    const int64_t n = SampleColumns(m);
    if (n == 0) continue;
    // n columns evenly spaced over the daemon's, from a start that the job,
    // the round and the tensor decide: the sample moves every round.
    const int64_t stride = m / n;
    const uint64_t h = HashRandom(seed_ ^ HashRandom(static_cast<uint64_t>(round) * 1315423911u +
                                                     static_cast<uint64_t>(t)));
    const int64_t start = static_cast<int64_t>(h % static_cast<uint64_t>(m));
    for (int64_t i = 0; i < n; ++i) {
      const int32_t c = cols[static_cast<size_t>((start + i * stride) % m)];
      p.slot_of[t][c] = static_cast<int32_t>(p.slots.size());
      p.slots.push_back({static_cast<int>(t), c, shapes_[t].rows, offset});
      offset += static_cast<size_t>(shapes_[t].rows * steps_ * sum_ranks_);
    }
  }
  std::fill(p.values.begin(), p.values.begin() + static_cast<std::ptrdiff_t>(offset), 0.0f);
  std::fill(p.received.begin(),
            p.received.begin() + static_cast<std::ptrdiff_t>(p.slots.size() * steps_ * world_), 0);
}

void UpdateDivergence::Invalidate() {
  for (Parity& p : parity_) p.round = -1;
}

std::vector<std::pair<int, int32_t>> UpdateDivergence::SampleOf(int64_t round) const {
  std::vector<std::pair<int, int32_t>> out;
  const Parity& p = parity_[round & 1];
  if (p.round != round) return out;
  for (const Sampled& s : p.slots) out.push_back({s.tensor, s.col});
  return out;
}

bool UpdateDivergence::Start(int64_t round, int32_t steps, TensorStore* store) {
  measured_ = nullptr;
  const Parity& p = parity_[round & 1];
  if (p.round != round || p.slots.empty() || steps < 1 || steps > steps_) return false;
  const size_t per_slot = static_cast<size_t>(steps_) * world_;
  for (size_t s = 0; s < p.slots.size(); ++s) {
    for (size_t i = 0; i < static_cast<size_t>(steps) * world_; ++i) {
      if (p.received[s * per_slot + i] == 0) return false;  // e.g. sent before a restore
    }
  }
  size_t n = 0;
  for (const Sampled& s : p.slots) n += static_cast<size_t>(s.rows);
  old_master_.resize(n);
  shadow_master_.resize(n);
  shadow_m_.resize(n);
  shadow_v_.resize(n);
  old_count_.resize(p.slots.size());
  size_t at = 0;
  for (size_t s = 0; s < p.slots.size(); ++s) {
    const Sampled& x = p.slots[s];
    const size_t bytes = static_cast<size_t>(x.rows) * sizeof(float);
    std::memcpy(old_master_.data() + at, store->master(x.tensor, x.col), bytes);
    store->CopyMoments(x.tensor, x.col, 1, shadow_m_.data() + at, shadow_v_.data() + at);
    old_count_[s] = store->count(x.tensor, x.col);
    at += static_cast<size_t>(x.rows);
  }
  std::memcpy(shadow_master_.data(), old_master_.data(), n * sizeof(float));
  measured_ = &p;
  measured_steps_ = steps;
  return true;
}

std::optional<float> UpdateDivergence::Finish(const TensorStore& store, const AdamWHyper& hyper,
                                              float clip, SimdLevel simd) {
  const Parity* p = measured_;
  measured_ = nullptr;
  if (p == nullptr) return std::nullopt;
  // Each step's mean over the ranks, scaled as the round's update scales
  // its mean (1 / rank-steps, in double, then the clipping factor).
  const float grad_scale = static_cast<float>(static_cast<double>(clip) / world_);
  double diff2 = 0, ref2 = 0;
  size_t at = 0;
  for (size_t s = 0; s < p->slots.size(); ++s) {
    const Sampled& x = p->slots[s];
    const size_t rows = static_cast<size_t>(x.rows);
    grad_.resize(rows);
    float* w = shadow_master_.data() + at;
    for (int32_t k = 0; k < measured_steps_; ++k) {
      // The ranks' values summed in rank order, as the round's sums fold.
      const float* v0 = p->values.data() + ValueAt(*p, static_cast<int>(s), 0, k);
      std::memcpy(grad_.data(), v0, rows * sizeof(float));
      for (int r = 1; r < sum_ranks_; ++r) {
        const float* vr = p->values.data() + ValueAt(*p, static_cast<int>(s), r, k);
        for (size_t i = 0; i < rows; ++i) grad_[i] += vr[i];
      }
      AdamWUpdate(simd, hyper, old_count_[s] + k + 1, grad_scale, grad_.data(), w,
                  shadow_m_.data() + at, shadow_v_.data() + at, rows);
    }
    const float* now = store.master(x.tensor, x.col);
    const float* old = old_master_.data() + at;
    for (size_t i = 0; i < rows; ++i) {
      const double applied = static_cast<double>(now[i]) - old[i];
      const double per_step = static_cast<double>(w[i]) - old[i];
      diff2 += (applied - per_step) * (applied - per_step);
      ref2 += per_step * per_step;
    }
    at += rows;
  }
  if (!(ref2 > 0) || !std::isfinite(diff2)) return std::nullopt;
  return static_cast<float>(std::sqrt(diff2 / ref2));
}

}  // namespace zenflow
