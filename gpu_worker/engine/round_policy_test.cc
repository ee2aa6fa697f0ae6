// RoundPolicy: the selection steps, the interval it picks from measured
// rounds and the apply delay, fed the figures a RoundDone carries.
#include "gpu_worker/engine/round_policy.h"

#include <cstdint>
#include <optional>
#include <vector>

#include "gtest/gtest.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {
namespace {

v1::JobSpec Spec(int32_t s, int32_t select, int32_t warmup, bool auto_interval) {
  v1::JobSpec spec;
  spec.set_mode(v1::MODE_ZENFLOW);
  v1::ZenFlowConfig* z = spec.mutable_zenflow();
  z->set_update_interval(s);
  z->set_select_interval(select);
  z->set_full_warmup_rounds(warmup);
  z->set_auto_update_interval(auto_interval);
  z->mutable_apply_delay()->set_adaptive(true);
  return spec;
}

// Feeds rounds 2.. of `steps` steps each, `step_s` seconds per step
// without stalls and `update_s` seconds from close to done.
void Measure(RoundPolicy* policy, int rounds, int32_t steps, double step_s, double update_s) {
  for (int r = 2; r < 2 + rounds; ++r) {
    policy->RoundApplied(r, steps, step_s * steps, /*stall_seconds=*/0, update_s);
  }
}

TEST(RoundPolicyTest, SelectionStepsFollowWarmupAndSelectInterval) {
  RoundPolicy policy(Spec(4, 100, 2, false), false);
  EXPECT_FALSE(policy.IsSelectionStep(0));
  EXPECT_TRUE(policy.IsSelectionStep(8));  // the end of the warm-up rounds
  EXPECT_FALSE(policy.IsSelectionStep(50));
  EXPECT_TRUE(policy.IsSelectionStep(100));
  EXPECT_TRUE(policy.IsSelectionStep(200));
  EXPECT_EQ(policy.NextSelectionStep(3), 8);
  EXPECT_EQ(policy.NextSelectionStep(8), 100);
  EXPECT_EQ(policy.NextSelectionStep(100), 200);
}

TEST(RoundPolicyTest, ZeroOffloadNeverSelectsAndAppliesAtOnce) {
  v1::JobSpec spec = Spec(4, 100, 0, true);
  spec.set_mode(v1::MODE_ZERO_OFFLOAD);
  RoundPolicy policy(spec, false);
  EXPECT_FALSE(policy.IsSelectionStep(0));
  EXPECT_FALSE(policy.IsSelectionStep(100));
  // No auto interval with zero_offload: S itself.
  EXPECT_EQ(policy.ChooseInterval(5, 20, nullptr), 4);
  PendingRound p{0, 3};
  policy.DecideDelayOf(&p);
  EXPECT_EQ(p.delay, 0);
}

TEST(RoundPolicyTest, FixedIntervalIsS) {
  RoundPolicy policy(Spec(4, 100, 0, false), false);
  Measure(&policy, 5, 4, 0.1, 10.0);  // measures do not matter
  EXPECT_EQ(policy.ChooseInterval(3, 12, nullptr), 4);
}

TEST(RoundPolicyTest, AutoIntervalCoversTheUpdateWithAMargin) {
  RoundPolicy policy(Spec(8, 1000, 1, true), false);
  // Warm-up rounds, and then nothing measured: S_max.
  EXPECT_EQ(policy.ChooseInterval(0, 0, nullptr), 8);
  EXPECT_EQ(policy.ChooseInterval(1, 8, nullptr), 8);
  // 0.1 s per step, 0.25 s per update: ceil(1.5 * 0.25 / 0.1) = 4 steps.
  Measure(&policy, 3, 8, 0.1, 0.25);
  EXPECT_EQ(policy.ChooseInterval(4, 40, nullptr), 4);
  // An update longer than S_max steps: S_max.
  Measure(&policy, 5, 8, 0.1, 5.0);
  EXPECT_EQ(policy.ChooseInterval(9, 80, nullptr), 8);
  // A fast update: one step.
  Measure(&policy, 5, 8, 0.1, 0.01);
  EXPECT_EQ(policy.ChooseInterval(14, 120, nullptr), 1);
}

TEST(RoundPolicyTest, StallsDoNotMakeStepsLookLonger) {
  RoundPolicy policy(Spec(8, 1000, 0, true), false);
  // 4 steps in 2 s of which 1.6 s stalled: 0.1 s per step; update 0.25 s.
  for (int r = 2; r < 5; ++r) policy.RoundApplied(r, 4, 2.0, 1.6, 0.25);
  EXPECT_EQ(policy.ChooseInterval(5, 20, nullptr), 4);
}

TEST(RoundPolicyTest, OneSlowRoundDoesNotSetThePace) {
  RoundPolicy policy(Spec(8, 1000, 0, true), false);
  Measure(&policy, 4, 4, 0.1, 0.25);
  policy.RoundApplied(9, 4, 0.4, 0, 3.0);  // one very slow update
  EXPECT_EQ(policy.ChooseInterval(10, 40, nullptr), 4);
}

TEST(RoundPolicyTest, RoundsZeroAndOneAreNotMeasures) {
  RoundPolicy policy(Spec(8, 1000, 0, true), /*predicted_step=*/true);
  policy.RoundApplied(0, 1, 0.1, 0, 50.0);
  policy.RoundApplied(1, 1, 0.1, 0, 50.0);
  // Still nothing measured: with the predicted step, one step per round.
  EXPECT_EQ(policy.ChooseInterval(2, 2, nullptr), 1);
}

TEST(RoundPolicyTest, PredictedStepStateMustFitOneStep) {
  RoundPolicy policy(Spec(8, 1000, 0, true), /*predicted_step=*/true);
  policy.set_moment_factor(3.0);
  // 1.5 * 0.05 = 0.075 s fits a 0.1 s step (S = 1), but three times the
  // bytes do not: two steps.
  Measure(&policy, 3, 4, 0.1, 0.05);
  EXPECT_EQ(policy.ChooseInterval(5, 20, nullptr), 2);
  // Without the predicted step's state it would be one.
  RoundPolicy plain(Spec(8, 1000, 0, true), false);
  Measure(&plain, 3, 4, 0.1, 0.05);
  EXPECT_EQ(plain.ChooseInterval(5, 20, nullptr), 1);
}

TEST(RoundPolicyTest, ChooserIsClampedAndRoundsEndBeforeSelection) {
  RoundPolicy policy(Spec(8, 100, 0, true), false);
  policy.set_chooser([](int64_t, int64_t) { return 50; });
  EXPECT_EQ(policy.ChooseInterval(1, 10, nullptr), 8);
  policy.set_chooser([](int64_t, int64_t) { return -3; });
  EXPECT_EQ(policy.ChooseInterval(2, 18, nullptr), 1);
  policy.set_chooser([](int64_t round, int64_t) { return static_cast<int32_t>(round); });
  EXPECT_EQ(policy.ChooseInterval(6, 30, nullptr), 6);
  // Step 97 + 6 would pass selection step 100: three steps.
  EXPECT_EQ(policy.ChooseInterval(6, 97, nullptr), 3);
}

TEST(RoundPolicyTest, PreviousRoundInFlightSetsTheMinimum) {
  v1::JobSpec spec = Spec(8, 1000, 0, true);
  spec.mutable_zenflow()->mutable_apply_delay()->set_steps(5);
  RoundPolicy policy(spec, false);
  policy.set_chooser([](int64_t, int64_t) { return 2; });
  PendingRound previous{3, 29, -1, 6};
  EXPECT_EQ(policy.ChooseInterval(4, 30, &previous), 5);
  EXPECT_EQ(previous.delay, 5);
  EXPECT_EQ(policy.apply_delay(3), 5);
  EXPECT_EQ(policy.apply_delay(4), -1);
}

TEST(RoundPolicyTest, DelayKinds) {
  v1::JobSpec spec = Spec(4, 1000, 0, false);
  spec.mutable_zenflow()->mutable_apply_delay()->set_sync(true);
  RoundPolicy sync(spec, false);
  PendingRound p{0, 3};
  sync.DecideDelayOf(&p);
  EXPECT_EQ(p.delay, 0);

  spec.mutable_zenflow()->mutable_apply_delay()->set_steps(3);
  RoundPolicy steps(spec, false);
  p = {0, 3};
  steps.DecideDelayOf(&p);
  EXPECT_EQ(p.delay, 3);
  // With auto_update_interval a fixed delay is held to the round's steps.
  spec.mutable_zenflow()->set_auto_update_interval(true);
  RoundPolicy steps_auto(spec, false);
  p = {0, 1, -1, 2};
  steps_auto.DecideDelayOf(&p);
  EXPECT_EQ(p.delay, 2);

  spec.mutable_zenflow()->set_auto_update_interval(false);
  spec.mutable_zenflow()->mutable_apply_delay()->set_overlap_step(true);
  RoundPolicy overlap(spec, false);
  p = {0, 3};
  overlap.DecideDelayOf(&p);
  EXPECT_EQ(p.delay, 4);
  // A decided delay stays.
  p.delay = 2;
  overlap.DecideDelayOf(&p);
  EXPECT_EQ(p.delay, 2);
}

TEST(RoundPolicyTest, AdaptiveDelayFromThePreviousRound) {
  RoundPolicy policy(Spec(8, 1000, 0, false), false);
  // Nothing measured: overlap fully.
  PendingRound p{1, 15};
  policy.DecideDelayOf(&p);
  EXPECT_EQ(p.delay, 8);
  // 0.1 s per step, 0.22 s per update: ceil(1.2 * 2.2) = 3 steps, once
  // round - 1 is the last applied.
  Measure(&policy, 3, 8, 0.1, 0.22);  // rounds 2..4
  p = {5, 47};
  policy.DecideDelayOf(&p);
  EXPECT_EQ(p.delay, 3);
  // Not right after the last applied round: assume it does not fit.
  p = {7, 63};
  policy.DecideDelayOf(&p);
  EXPECT_EQ(p.delay, 8);
  // At least one step, at most the round's.
  Measure(&policy, 5, 8, 0.1, 0.001);  // rounds 2..6
  p = {7, 63};
  policy.DecideDelayOf(&p);
  EXPECT_EQ(p.delay, 1);
  Measure(&policy, 5, 8, 0.1, 10.0);
  p = {7, 63, -1, 5};
  policy.DecideDelayOf(&p);
  EXPECT_EQ(p.delay, 5);
}

// docs/design.md rules 10 and 14: auto chooses the smallest S that hides
// the round, but not an S whose measured divergence exceeded the budget.
TEST(RoundPolicyTest, FidelityBudgetCapsAutoInterval) {
  v1::JobSpec spec = Spec(8, 1000, 0, true);
  spec.mutable_zenflow()->set_fidelity_budget(0.2f);
  RoundPolicy policy(spec, false);
  // 0.1 s steps, a 0.5 s update: S = ceil(1.5 * 5) = 8 hides it.
  Measure(&policy, 5, 8, 0.1, 0.5);
  EXPECT_EQ(policy.ChooseInterval(7, 56, nullptr), 8);
  EXPECT_EQ(policy.FidelityCap(), 8);
  // S = 2 measured within the budget, S = 4 beyond it (median of three;
  // one low figure does not lift it).
  for (float d : {0.05f, 0.06f, 0.04f}) policy.RoundDivergence(2, d);
  for (float d : {0.3f, 0.1f, 0.35f}) policy.RoundDivergence(4, d);
  EXPECT_EQ(policy.FidelityCap(), 3);
  EXPECT_EQ(policy.ChooseInterval(8, 64, nullptr), 3);
  // A longer S beyond it too changes nothing; only its first two figures
  // do not decide.
  policy.RoundDivergence(6, 0.5f);
  EXPECT_EQ(policy.FidelityCap(), 3);
  // S = 3 beyond it as well: at most 2.
  for (float d : {0.25f, 0.25f, 0.25f}) policy.RoundDivergence(3, d);
  EXPECT_EQ(policy.ChooseInterval(9, 67, nullptr), 2);
  // A fast daemon still gets the smallest S that hides it.
  Measure(&policy, 5, 2, 0.1, 0.05);
  EXPECT_EQ(policy.ChooseInterval(10, 69, nullptr), 1);
  // Auto warns nobody: it keeps within the budget.
  EXPECT_FALSE(policy.TakeBudgetWarning().has_value());
}

TEST(RoundPolicyTest, NoFidelityLimitAtZeroOrBelow) {
  for (float budget : {0.0f, -1.0f}) {
    v1::JobSpec spec = Spec(8, 1000, 0, true);
    spec.mutable_zenflow()->set_fidelity_budget(budget);
    RoundPolicy policy(spec, false);
    Measure(&policy, 5, 8, 0.1, 0.5);
    for (int i = 0; i < 5; ++i) policy.RoundDivergence(2, 5.0f);
    EXPECT_EQ(policy.FidelityCap(), 8);
    EXPECT_EQ(policy.ChooseInterval(7, 56, nullptr), 8) << budget;
  }
}

// Every rank is fed the same RoundDones in the same order: every rank
// chooses the same S, whatever its own step times (which only enter
// through the RoundDone's figures).
TEST(RoundPolicyTest, EveryRankChoosesTheSameCappedInterval) {
  v1::JobSpec spec = Spec(8, 1000, 0, true);
  spec.mutable_zenflow()->set_fidelity_budget(0.35f);
  std::vector<RoundPolicy> ranks(3, RoundPolicy(spec, true));
  for (RoundPolicy& p : ranks) {
    for (int r = 2; r < 12; ++r) {
      const int32_t s = 2 + r % 4;
      p.RoundApplied(r, s, 0.1 * s, 0.01, 0.45);
      p.RoundDivergence(s, 0.1f * static_cast<float>(s - 1));
    }
  }
  const int32_t s0 = ranks[0].ChooseInterval(12, 100, nullptr);
  // S = 4 measured 0.3 (within), S = 5 0.4 (beyond): at most 4, though 7
  // would hide the round.
  EXPECT_EQ(s0, 4);
  for (RoundPolicy& p : ranks) EXPECT_EQ(p.ChooseInterval(12, 100, nullptr), s0);
}

TEST(RoundPolicyTest, AFixedIntervalBeyondTheBudgetIsToldOnce) {
  v1::JobSpec spec = Spec(4, 1000, 0, false);
  spec.mutable_zenflow()->set_fidelity_budget(0.2f);
  RoundPolicy policy(spec, false);
  for (int i = 0; i < 4; ++i) policy.RoundDivergence(4, 0.7f);
  EXPECT_FALSE(policy.TakeBudgetWarning().has_value());  // four rounds: not yet
  policy.RoundDivergence(4, 0.75f);
  const std::optional<float> w = policy.TakeBudgetWarning();
  ASSERT_TRUE(w.has_value());
  EXPECT_FLOAT_EQ(*w, 0.7f);
  policy.RoundDivergence(4, 0.75f);
  EXPECT_FALSE(policy.TakeBudgetWarning().has_value());  // once
  // The interval is the user's: not capped.
  EXPECT_EQ(policy.ChooseInterval(9, 36, nullptr), 4);
}

}  // namespace
}  // namespace zenflow
