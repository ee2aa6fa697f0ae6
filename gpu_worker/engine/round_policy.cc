// The engine's round schedule; see round_policy.h.
#include "gpu_worker/engine/round_policy.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace zenflow {

RoundPolicy::RoundPolicy(const v1::JobSpec& spec, bool predicted_step)
    : config_(spec.zenflow()),
      interval_(std::max(1, spec.zenflow().update_interval())),
      zero_offload_(spec.mode() == v1::MODE_ZERO_OFFLOAD),
      auto_interval_(spec.zenflow().auto_update_interval() && !zero_offload_),
      predicted_step_(predicted_step),
      fidelity_budget_(spec.zenflow().fidelity_budget()) {}

bool RoundPolicy::IsSelectionStep(int64_t step) const {
  if (zero_offload_) return false;
  const int64_t warm_end = static_cast<int64_t>(config_.full_warmup_rounds()) * interval_;
  const int64_t r = std::max(1, config_.select_interval());
  return step == warm_end || (step > warm_end && step % r == 0);
}

int64_t RoundPolicy::NextSelectionStep(int64_t step) const {
  const int64_t warm_end = static_cast<int64_t>(config_.full_warmup_rounds()) * interval_;
  if (step < warm_end) return warm_end;
  const int64_t r = std::max(1, config_.select_interval());
  return (step / r + 1) * r;
}

// Medians of the recent measures (robust to one slow step or update): the
// lower one of the step time, the upper one of the update time.
double RoundPolicy::Measured(double Measure::*field, bool upper) const {
  std::vector<double> x;
  for (const Measure& m : measures_) x.push_back(m.*field);
  std::sort(x.begin(), x.end());
  return x[upper ? x.size() / 2 : (x.size() - 1) / 2];
}

int32_t RoundPolicy::ChooseInterval(int64_t round, int64_t start, PendingRound* previous) {
  constexpr double kIntervalMargin = 1.5;
  const int32_t s_max = static_cast<int32_t>(interval_);
  if (!auto_interval_) return s_max;
  int32_t s = s_max;
  if (round >= config_.full_warmup_rounds()) {
    if (chooser_) {
      s = std::max(1, std::min(chooser_(round, start), s_max));
    } else if (!measures_.empty()) {
      // The smallest S whose device steps cover the measured close-to-done
      // time with a margin: the inputs of the adaptive apply delay (rule 7),
      // from RoundDones every rank applied by this step.
      const double step_seconds = Measured(&Measure::step_seconds, false);
      const double round_seconds = Measured(&Measure::round_seconds, true);
      // (A wider margin than the delay's: a round too short to hide stalls
      // every rank, a round longer than needed only costs fidelity.)
      const double want = std::ceil(kIntervalMargin * round_seconds / step_seconds);
      s = !(want < s_max) ? s_max : want <= 1 ? 1 : static_cast<int32_t>(want);  // NaN: S_max
      // A one-step round's deltas carry the predicted step's state too
      // (several times the bytes): measured on a longer round, one step
      // must fit that as well.
      if (s == 1 && predicted_step_ && last_done_steps_ > 1 &&
          !(kIntervalMargin * round_seconds * moment_factor_ <= step_seconds)) {
        s = std::min<int32_t>(2, s_max);
      }
      // Not above an S whose update was measured too far from per-step
      // AdamW (docs/design.md rules 10 and 14): a small stall is better
      // than a silent loss of fidelity.
      s = std::min(s, FidelityCap());
    } else if (predicted_step_) {
      // Nothing measured yet: with the predicted step, start at one step
      // per round (the first steps of fine-tuning weigh the most: every
      // column takes its AdamW steps at once). The first measure is round
      // 2's RoundDone, at step 3's end: the pace from step 4 on.
      s = 1;
    }
  }
  // The previous round, if still in flight, is applied before the round
  // after this one starts: the daemon accumulates two rounds at a time.
  if (previous != nullptr) {
    DecideDelayOf(previous);
    s = std::max(s, previous->delay);
  }
  // A round never spans a selection step.
  return static_cast<int32_t>(std::min<int64_t>(s, NextSelectionStep(start) - start));
}

int32_t RoundPolicy::apply_delay(int64_t round) const {
  for (const auto& [r, d] : delays_) {
    if (r == round) return d;
  }
  return -1;
}

int32_t RoundPolicy::DecideDelay(const PendingRound& p) {
  const int64_t round = p.round;
  // The round's own steps: update_interval, but for a partial last round or
  // with auto_update_interval.
  const int32_t steps = p.steps > 0 ? p.steps : static_cast<int32_t>(interval_);
  int32_t d = 1;
  const v1::ApplyDelay& ad = config_.apply_delay();
  if (zero_offload_ || ad.kind_case() == v1::ApplyDelay::kSync) {
    d = 0;
  } else if (ad.kind_case() == v1::ApplyDelay::kSteps) {
    // At most the round's steps (the daemon holds it to update_interval,
    // which a shorter auto round may undercut).
    d = auto_interval_ ? std::max(1, std::min(ad.steps(), steps)) : ad.steps();
  } else if (ad.kind_case() == v1::ApplyDelay::kOverlapStep) {
    d = steps;
  } else {
    // Adaptive, from round-1's RoundDone, which every rank has applied by
    // the time this is asked (d <= S): the same answer on every rank. Until
    // there is a measurement (the first two rounds), assume the update does
    // not fit and overlap fully (d = S).
    d = steps;
    if (last_done_round_ == round - 1 && !measures_.empty()) {
      d = static_cast<int32_t>(std::ceil(1.2 * Measured(&Measure::round_seconds, true) /
                                         Measured(&Measure::step_seconds, false)));
      d = std::max<int32_t>(1, std::min<int32_t>(d, steps));
    }
  }
  delays_.push_back({round, d});
  if (delays_.size() > 64) delays_.erase(delays_.begin());
  return d;
}

namespace {

// The median of a round's measures: the upper one.
float Median(const std::deque<float>& x) {
  std::vector<float> sorted(x.begin(), x.end());
  std::sort(sorted.begin(), sorted.end());
  return sorted[sorted.size() / 2];
}

}  // namespace

void RoundPolicy::RoundDivergence(int32_t steps, float divergence) {
  if (!(divergence >= 0) || steps < 1) return;
  std::deque<float>& d = divergences_[steps];
  d.push_back(divergence);
  if (d.size() > 5) d.pop_front();
}

int32_t RoundPolicy::FidelityCap() const {
  const int32_t s_max = static_cast<int32_t>(interval_);
  if (!(fidelity_budget_ > 0)) return s_max;
  // Ascending S: the first one over the budget caps every longer one too
  // (the divergence grows with S).
  for (const auto& [s, d] : divergences_) {
    if (d.size() >= 3 && Median(d) > fidelity_budget_) return std::max(1, s - 1);
  }
  return s_max;
}

std::optional<float> RoundPolicy::TakeBudgetWarning() {
  if (auto_interval_ || budget_warned_ || !(fidelity_budget_ > 0)) return std::nullopt;
  auto it = divergences_.find(static_cast<int32_t>(interval_));
  if (it == divergences_.end() || it->second.size() < 5) return std::nullopt;
  const float median = Median(it->second);
  if (!(median > fidelity_budget_)) return std::nullopt;
  budget_warned_ = true;
  return median;
}

void RoundPolicy::RoundApplied(int64_t round, int32_t steps, double interval_seconds,
                               double stall_seconds, double close_to_done_seconds) {
  if (interval_seconds > 0 && round >= 2) {
    // Seconds per step without the ranks' waits for deltas
    // (RoundDone.stall_seconds): a stall must not make steps look longer,
    // or the next rounds would be chosen shorter and stall more. (At least
    // a twentieth of the interval: the stall is the ranks' own report.)
    // Round 1's interval holds the rest of step 0, with its one-time work
    // (first allocations, step 0's predicted step): not a measure.
    const double busy = std::max(interval_seconds - stall_seconds, 0.05 * interval_seconds);
    measures_.push_back({busy / std::max(steps, 1), close_to_done_seconds});
    if (measures_.size() > 5) measures_.pop_front();
  }
  last_done_round_ = round;
  last_done_steps_ = steps;
}

}  // namespace zenflow
