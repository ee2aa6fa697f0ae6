// A job's update divergence (docs/design.md rule 14): the measure of a
// round's update against per-step AdamW (UpdateDivergence), what the job
// keeps of it, and the one warning a fixed update_interval gets when its
// divergence exceeds the job's fidelity_budget. Part of Job; see job.h.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <vector>

#include "server/job.h"

namespace zenflow {

std::optional<float> Job::MeasureDivergence(float lr, float grad_norm, TensorStore* store) {
  const v1::AdamWConfig& cfg = spec_.adamw();
  const AdamWHyper h{lr, cfg.beta1(), cfg.beta2(), cfg.eps(), cfg.weight_decay()};
  // The round's clipping factor (round_update.cc) stands for each step's.
  float clip = 1.0f;
  if (cfg.max_grad_norm() > 0 && grad_norm > cfg.max_grad_norm()) {
    clip = static_cast<float>(cfg.max_grad_norm() / (static_cast<double>(grad_norm) + 1e-6));
  }
  return divergence_->Finish(*store, h, clip, ctx_.simd);
}

void Job::NoteDivergenceLocked(float divergence, int32_t steps) {
  stats_.last_update_divergence = divergence;
  recent_divergence_.push_back(divergence);
  if (recent_divergence_.size() > kDivergenceWindow) {
    recent_divergence_.erase(recent_divergence_.begin());
  }
  // With update_interval auto the ranks keep S within the budget; a fixed
  // interval is the user's choice, told once, from the median of the last
  // rounds (one round's figure is noisy).
  const float budget = spec_.zenflow().fidelity_budget();
  if (auto_interval_ || budget_warned_ || !(budget > 0) ||
      recent_divergence_.size() < kDivergenceWindow) {
    return;
  }
  std::vector<float> sorted = recent_divergence_;
  std::sort(sorted.begin(), sorted.end());
  const float median = sorted[sorted.size() / 2];
  if (median > budget) {
    budget_warned_ = true;
    std::fprintf(stderr,
                 "zenflowd: job '%s': update_interval %d has an update divergence of %.3f "
                 "(median of the last %zu rounds), above its fidelity_budget %.3f: its "
                 "unimportant columns move unlike per-step AdamW (docs/design.md rule 14; "
                 "update_interval auto keeps within the budget)\n",
                 spec_.job_id().c_str(), steps, median, sorted.size(), budget);
  }
}

}  // namespace zenflow
