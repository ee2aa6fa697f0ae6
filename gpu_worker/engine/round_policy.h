// The engine's round schedule (rules 7, 8 and 10): which steps
// reselect the important columns, how many steps each round has (fixed, or
// with auto_update_interval chosen from the daemon's measured round time)
// and after how many steps a closed round's deltas are applied (the apply
// delay: sync, fixed, overlap_step or adaptive).
//
// It holds no buffers and calls nothing: it is fed the RoundDone figures of
// the rounds the optimizer applies, and answers from them. Every rank feeds
// it the same figures in the same order, so every rank gets the same answers.
#ifndef ZENFLOW_GPU_WORKER_ENGINE_ROUND_POLICY_H_
#define ZENFLOW_GPU_WORKER_ENGINE_ROUND_POLICY_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

// With auto_update_interval: the steps S(r) of round `round`, which starts
// at step `start_step`, asked at that step. Must answer the same on every
// rank (it depends on nothing but its arguments, or on what every rank
// holds alike).
using IntervalChooser = std::function<int32_t(int64_t round, int64_t start_step)>;

// A closed round whose deltas are not applied yet.
struct PendingRound {
  int64_t round;
  int64_t close_step;
  int32_t delay = -1;  // decided lazily (adaptive)
  int32_t steps = 0;   // the round's steps
};

// Thread-compatible.
class RoundPolicy {
 public:
  // `spec` is the job's normalized spec; `predicted_step` whether its
  // one-step rounds carry the predicted step's state (rule 11).
  RoundPolicy(const v1::JobSpec& spec, bool predicted_step);

  // See ZenFlowOptimizer::set_interval_chooser.
  void set_chooser(IntervalChooser chooser) { chooser_ = std::move(chooser); }
  // Delta bytes of a one-step round with the predicted step's state over
  // those without (1 when no tensor has daemon columns).
  void set_moment_factor(double factor) { moment_factor_ = factor; }

  // S, or S_max with auto_update_interval.
  int64_t interval() const { return interval_; }
  bool zero_offload() const { return zero_offload_; }

  // Whether the important columns are reselected at `step` (rule 8).
  bool IsSelectionStep(int64_t step) const;
  // The first selection step after `step` (zenflow mode).
  int64_t NextSelectionStep(int64_t step) const;

  // The steps of round `round`, which starts at step `start` (docs/design.md rule 10).
  // `previous` is round - 1 while it is still in flight (else null): its
  // delay is decided here if it was not yet, and the new round is at least
  // that long (the daemon accumulates two rounds at a time).
  int32_t ChooseInterval(int64_t round, int64_t start, PendingRound* previous);

  // Decides `p`'s apply delay if it is not decided yet (rule 7).
  void DecideDelayOf(PendingRound* p) {
    if (p->delay < 0) p->delay = DecideDelay(*p);
  }
  // The apply delay chosen for `round` (-1 if not decided yet).
  int32_t apply_delay(int64_t round) const;

  // Round `round` (of `steps` steps, the RoundDone's if it says) was
  // applied; its RoundDone measured `interval_seconds` from the previous
  // close to this one, of which the ranks stalled `stall_seconds`, and
  // `close_to_done_seconds` for the daemon's update.
  void RoundApplied(int64_t round, int32_t steps, double interval_seconds, double stall_seconds,
                    double close_to_done_seconds);
  // An applied round of `steps` steps whose RoundDone reported an update
  // divergence (docs/design.md rule 14). Fed, like RoundApplied, in the
  // same order on every rank.
  void RoundDivergence(int32_t steps, float divergence);
  // The largest S auto chooses: one below the smallest S whose median
  // divergence (of its last five measures, at least three) exceeded
  // fidelity_budget; S_max when none did or the budget is <= 0 (no limit).
  int32_t FidelityCap() const;
  // With a fixed interval: the median divergence of its last five rounds,
  // the first time it exceeds fidelity_budget (for a warning); empty
  // otherwise and ever after.
  std::optional<float> TakeBudgetWarning();

 private:
  // A recent round's measures: seconds per step without stalls, and its
  // update time (close to done).
  struct Measure {
    double step_seconds;
    double round_seconds;
  };
  // The median of one over measures_: the upper one or the lower one.
  double Measured(double Measure::*field, bool upper) const;
  int32_t DecideDelay(const PendingRound& p);

  const v1::ZenFlowConfig config_;
  const int64_t interval_;  // S, or S_max with auto_interval_
  const bool zero_offload_;
  const bool auto_interval_;  // auto_update_interval (never with zero_offload)
  const bool predicted_step_;
  IntervalChooser chooser_;  // empty: from the measured round time
  double moment_factor_ = 1;
  // The last (up to) five measured rounds: the choices take medians (one
  // slow step or update must not set the pace).
  std::deque<Measure> measures_;
  // The last applied round and its steps.
  int64_t last_done_round_ = -1;
  int32_t last_done_steps_ = 0;
  std::vector<std::pair<int64_t, int32_t>> delays_;  // (round, d), recent
  // fidelity_budget (<= 0: no limit) and, per S, the last (up to) five
  // measured divergences.
  const float fidelity_budget_;
  std::map<int32_t, std::deque<float>> divergences_;
  bool budget_warned_ = false;
};

}  // namespace zenflow

#endif  // ZENFLOW_GPU_WORKER_ENGINE_ROUND_POLICY_H_
