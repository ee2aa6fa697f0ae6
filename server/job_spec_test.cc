// Unit tests of a job spec's checks: defaults, limits, a partition's map
// and the job's footprint.
#include "server/job_spec.h"

#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "common/geometry.h"
#include "server/test_specs.h"

namespace zenflow {
namespace {

TEST(NormalizeJobSpecTest, FillsDefaults) {
  v1::JobSpec spec = OneTensorSpec(1, 4);
  spec.set_wire_dtype(v1::DTYPE_UNSPECIFIED);
  ASSERT_TRUE(NormalizeJobSpec(&spec, 64 << 20).ok());
  EXPECT_FLOAT_EQ(spec.adamw().lr(), 1e-3f);
  EXPECT_FLOAT_EQ(spec.adamw().beta1(), 0.9f);
  EXPECT_FLOAT_EQ(spec.adamw().beta2(), 0.999f);
  EXPECT_FLOAT_EQ(spec.adamw().weight_decay(), 0.01f);
  EXPECT_FLOAT_EQ(spec.zenflow().topk_ratio(), 0.1f);
  EXPECT_EQ(spec.zenflow().select_interval(), 100);
  EXPECT_TRUE(spec.zenflow().apply_delay().adaptive());
  // docs/design.md rule 5: int8 shards for zenflow, bf16 for zero_offload.
  EXPECT_EQ(spec.wire_dtype(), v1::DTYPE_INT8);
  EXPECT_EQ(spec.max_shard_bytes(), 4 << 20);
  v1::JobSpec zo = OneTensorSpec(1, 4);
  zo.set_wire_dtype(v1::DTYPE_UNSPECIFIED);
  zo.set_mode(v1::MODE_ZERO_OFFLOAD);
  ASSERT_TRUE(NormalizeJobSpec(&zo, 64 << 20).ok());
  EXPECT_EQ(zo.wire_dtype(), v1::DTYPE_BF16);
  v1::JobSpec chosen = OneTensorSpec(1, 4);
  chosen.set_wire_dtype(v1::DTYPE_BF16);
  ASSERT_TRUE(NormalizeJobSpec(&chosen, 64 << 20).ok());
  EXPECT_EQ(chosen.wire_dtype(), v1::DTYPE_BF16);
}

TEST(NormalizeJobSpecTest, PredictedStepIsOnUnlessArithmeticOrZeroOffload) {
  v1::JobSpec spec = OneTensorSpec(1, 1);
  ASSERT_TRUE(NormalizeJobSpec(&spec, 64 << 20).ok());
  EXPECT_TRUE(spec.zenflow().has_predicted_step());
  EXPECT_TRUE(spec.zenflow().predicted_step());
  spec = OneTensorSpec(1, 1);
  spec.mutable_zenflow()->set_predicted_step(false);
  ASSERT_TRUE(NormalizeJobSpec(&spec, 64 << 20).ok());
  EXPECT_FALSE(spec.zenflow().predicted_step());
  spec = OneTensorSpec(1, 1);
  spec.set_delta_kind(v1::DELTA_ARITHMETIC);
  ASSERT_TRUE(NormalizeJobSpec(&spec, 64 << 20).ok());
  EXPECT_FALSE(spec.zenflow().predicted_step());
  spec.mutable_zenflow()->set_predicted_step(true);
  const absl::Status bad = NormalizeJobSpec(&spec, 64 << 20);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  spec = OneTensorSpec(1, 1);
  spec.set_mode(v1::MODE_ZERO_OFFLOAD);
  spec.mutable_zenflow()->set_predicted_step(true);
  ASSERT_TRUE(NormalizeJobSpec(&spec, 64 << 20).ok());
  EXPECT_FALSE(spec.zenflow().predicted_step());
}

// Rules 12 and 13 (the scaled round step, the local step): on by default
// in zenflow mode, off for zero_offload; the local step needs values
// deltas, refused with arithmetic ones (and off by default there).
TEST(NormalizeJobSpecTest, ScaledRoundStepAndLocalStepDefaults) {
  v1::JobSpec spec = OneTensorSpec(1, 4);
  ASSERT_TRUE(NormalizeJobSpec(&spec, 64 << 20).ok());
  // Off by default (docs/design.md rules 12 and 13: measured to cost
  // fidelity on the demo's fine-tuning).
  EXPECT_TRUE(spec.zenflow().has_scale_round_step() && !spec.zenflow().scale_round_step());
  EXPECT_TRUE(spec.zenflow().has_local_step() && !spec.zenflow().local_step());
  EXPECT_FALSE(DeltasCarryFactoredMoment(spec));

  spec = OneTensorSpec(1, 4);
  spec.mutable_zenflow()->set_scale_round_step(true);
  spec.mutable_zenflow()->set_local_step(true);
  ASSERT_TRUE(NormalizeJobSpec(&spec, 64 << 20).ok());
  EXPECT_TRUE(spec.zenflow().scale_round_step());
  EXPECT_TRUE(spec.zenflow().local_step());
  EXPECT_TRUE(DeltasCarryFactoredMoment(spec));

  spec = OneTensorSpec(1, 4);
  spec.set_delta_kind(v1::DELTA_ARITHMETIC);
  ASSERT_TRUE(NormalizeJobSpec(&spec, 64 << 20).ok());
  EXPECT_FALSE(spec.zenflow().local_step());
  spec = OneTensorSpec(1, 4);
  spec.set_delta_kind(v1::DELTA_ARITHMETIC);
  spec.mutable_zenflow()->set_scale_round_step(true);
  ASSERT_TRUE(NormalizeJobSpec(&spec, 64 << 20).ok());
  EXPECT_TRUE(spec.zenflow().scale_round_step()) << "rule 12 does not depend on the delta kind";
  spec.mutable_zenflow()->set_local_step(true);
  const absl::Status bad = NormalizeJobSpec(&spec, 64 << 20);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  EXPECT_TRUE(absl::StrContains(bad.message(), "zenflow.local_step needs DELTA_VALUES")) << bad;

  spec = OneTensorSpec(1, 4);
  spec.set_mode(v1::MODE_ZERO_OFFLOAD);
  spec.mutable_zenflow()->set_scale_round_step(true);
  spec.mutable_zenflow()->set_local_step(true);
  ASSERT_TRUE(NormalizeJobSpec(&spec, 64 << 20).ok());
  EXPECT_FALSE(spec.zenflow().scale_round_step());
  EXPECT_FALSE(spec.zenflow().local_step());
  EXPECT_FALSE(DeltasCarryFactoredMoment(spec));
}

TEST(NormalizeJobSpecTest, FidelityBudgetMustBeFinite) {
  for (float ok : {0.0f, -1.0f, 0.05f, 3.0f}) {
    v1::JobSpec spec = OneTensorSpec(1, 4);
    spec.mutable_zenflow()->set_fidelity_budget(ok);
    ASSERT_TRUE(NormalizeJobSpec(&spec, 64 << 20).ok()) << ok;
    EXPECT_EQ(spec.zenflow().fidelity_budget(), ok) << "kept as given";
  }
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    v1::JobSpec spec = OneTensorSpec(1, 4);
    spec.mutable_zenflow()->set_fidelity_budget(bad);
    const absl::Status s = NormalizeJobSpec(&spec, 64 << 20);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(absl::StrContains(s.message(), "zenflow.fidelity_budget")) << s;
  }
}

// Rule 12: a round of s steps takes one step of s times its learning rate
// (an fp32 product); one-step rounds, the option off and zero_offload keep lr.
TEST(RoundStepLrTest, ScalesByTheRoundsSteps) {
  v1::JobSpec spec = OneTensorSpec(1, 4);
  ASSERT_TRUE(NormalizeJobSpec(&spec, 64 << 20).ok());
  EXPECT_EQ(RoundStepLr(spec, 3e-4f, 4), 3e-4f) << "off by default";
  spec.mutable_zenflow()->set_scale_round_step(true);
  EXPECT_EQ(RoundStepLr(spec, 3e-4f, 4), 3e-4f * 4.0f);
  EXPECT_EQ(RoundStepLr(spec, 3e-4f, 3), 3e-4f * 3.0f);
  EXPECT_EQ(RoundStepLr(spec, 3e-4f, 1), 3e-4f);
  spec.mutable_zenflow()->set_scale_round_step(false);
  EXPECT_EQ(RoundStepLr(spec, 3e-4f, 4), 3e-4f);
  v1::JobSpec offload = OneTensorSpec(1, 4);
  offload.set_mode(v1::MODE_ZERO_OFFLOAD);
  ASSERT_TRUE(NormalizeJobSpec(&offload, 64 << 20).ok());
  EXPECT_EQ(RoundStepLr(offload, 3e-4f, 1), 3e-4f);
}

// Rule 13's fields travel in every delta message and the update sums them
// in doubles: the footprint counts both, and nothing more per parameter
// than O(rows + cols) per tensor.
TEST(JobFootprintTest, CountsTheFactoredMoment) {
  v1::JobSpec on = OneTensorSpec(1, 4);
  on.mutable_zenflow()->set_local_step(true);  // off by default
  ASSERT_TRUE(NormalizeJobSpec(&on, 64 << 20).ok());
  v1::JobSpec off = on;
  off.mutable_zenflow()->set_local_step(false);
  absl::StatusOr<JobFootprint> a = ComputeJobFootprint(on), b = ComputeJobFootprint(off);
  ASSERT_TRUE(a.ok() && b.ok());
  // A 2 x 3 tensor in one message: row_v, col_v and v_mean (4 x 6 B) of the
  // one round the update holds (it holds all of it until the moment is
  // added; without it, at most one round too: two batches of a round), plus
  // the doubles of the sums (2 + 3) and the result (4 x 6 B).
  EXPECT_EQ(a->delta_bytes - b->delta_bytes, 24 + 8 * 5 + 24);
  EXPECT_EQ(a->state_bytes, b->state_bytes);
}

// A round larger than two batches: the reserve is two batches of
// kDeltaWindowBytes (the update hands the rest to the outboxes as it goes),
// not the round.
TEST(JobFootprintTest, ChargesTwoBatchesOfALargeRound) {
  v1::JobSpec spec = OneTensorSpec(2, 1);
  spec.mutable_tensors(0)->set_shape(0, 4096);
  spec.mutable_tensors(0)->set_shape(1, 8192);
  ASSERT_TRUE(NormalizeJobSpec(&spec, int64_t{1} << 40).ok());
  absl::StatusOr<JobFootprint> f = ComputeJobFootprint(spec);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->delta_bytes, 2 * kDeltaWindowBytes);
  // A message larger than a batch (one column of 8M fp32 values with m, v):
  // two such messages.
  v1::JobSpec tall = OneTensorSpec(2, 1);
  tall.mutable_tensors(0)->set_shape(0, int64_t{1} << 23);
  tall.mutable_tensors(0)->set_shape(1, 4);
  ASSERT_TRUE(NormalizeJobSpec(&tall, int64_t{1} << 40).ok());
  absl::StatusOr<JobFootprint> t = ComputeJobFootprint(tall);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->delta_bytes, 2 * (int64_t{1} << 23) * 8);
}

// One-step rounds' deltas carry bf16 m and v: the footprint counts them
// where rounds can have one step.
TEST(JobFootprintTest, CountsThePredictedStepsStateWhereRoundsCanHaveOneStep) {
  v1::JobSpec four = OneTensorSpec(1, 4), one = OneTensorSpec(1, 1);
  // (Without the local step's fields, which do not scale with the values.)
  four.mutable_zenflow()->set_local_step(false);
  one.mutable_zenflow()->set_local_step(false);
  ASSERT_TRUE(NormalizeJobSpec(&four, 64 << 20).ok());
  ASSERT_TRUE(NormalizeJobSpec(&one, 64 << 20).ok());
  absl::StatusOr<JobFootprint> f4 = ComputeJobFootprint(four), f1 = ComputeJobFootprint(one);
  ASSERT_TRUE(f4.ok() && f1.ok());
  EXPECT_EQ(f1->delta_bytes, 2 * f4->delta_bytes);  // fp32 values + bf16 m and v
  v1::JobSpec automatic = four;
  automatic.mutable_zenflow()->set_auto_update_interval(true);
  EXPECT_EQ(ComputeJobFootprint(automatic)->delta_bytes, f1->delta_bytes);
  one.mutable_zenflow()->set_predicted_step(false);
  EXPECT_EQ(ComputeJobFootprint(one)->delta_bytes, f4->delta_bytes);
}

TEST(NormalizeJobSpecTest, ZeroOffloadForcesItsSettings) {
  v1::JobSpec spec = OneTensorSpec(1, 4);
  spec.set_mode(v1::MODE_ZERO_OFFLOAD);
  spec.mutable_zenflow()->set_topk_ratio(0.5f);
  ASSERT_TRUE(NormalizeJobSpec(&spec, 64 << 20).ok());
  EXPECT_EQ(spec.zenflow().topk_ratio(), 0.0f);
  EXPECT_EQ(spec.zenflow().update_interval(), 1);
  EXPECT_TRUE(spec.zenflow().apply_delay().sync());
}

TEST(NormalizeJobSpecTest, ExplicitZeroTopkAndWeightDecayAreKept) {
  v1::JobSpec spec = OneTensorSpec(1, 4);
  spec.mutable_zenflow()->set_topk_ratio(0.0f);
  spec.mutable_adamw()->set_weight_decay(0.0f);
  ASSERT_TRUE(NormalizeJobSpec(&spec, 64 << 20).ok());
  EXPECT_EQ(spec.zenflow().topk_ratio(), 0.0f);
  EXPECT_EQ(spec.adamw().weight_decay(), 0.0f);
}

TEST(JobFootprintTest, CountsStateBookkeepingAndDeltasAndRefusesOverflow) {
  v1::JobSpec spec = OneTensorSpec(4, 1);
  spec.mutable_tensors(0)->set_dtype(v1::DTYPE_BF16);
  ASSERT_TRUE(NormalizeJobSpec(&spec, 64 << 20).ok());
  absl::StatusOr<JobFootprint> f = ComputeJobFootprint(spec);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->params, 6);
  EXPECT_EQ(f->state_bytes, 6 * 20);
  // Per column (and its number among the daemon's: cols + 1 of 4 B); per
  // rank and step of its open round (S = 1: one), never per rank x column;
  // the update divergence's side buffers (one sampled column of 2 rows,
  // one step: two rounds of fp32 values and of 4 ranks' flags, an int32
  // slot per column and round, and the update's 5 floats per sampled
  // value).
  const int64_t divergence = 2 * (2 * 4) + 2 * 4 + 2 * 3 * 4 + 2 * 5 * 4;
  EXPECT_EQ(f->bookkeeping_bytes,
            3 * 17 + (3 + 1) * 4 + 4 * (24 + 1 * (32 + 16 * 8)) + divergence);
  // The update's two batches of bf16 deltas with bf16 m and v (one-step
  // rounds carry the predicted step's state), at most one round: here the
  // whole round; the local step, which would add its factored moment
  // (CountsTheFactoredMoment), is off by default.
  EXPECT_EQ(f->delta_bytes, 6 * (2 + 4));
  EXPECT_EQ(f->total(), f->state_bytes + f->bookkeeping_bytes + f->delta_bytes);
  // Rank-ordered sums: two accumulation buffers per rank.
  spec.set_rank_ordered_sums(true);
  absl::StatusOr<JobFootprint> ordered = ComputeJobFootprint(spec);
  ASSERT_TRUE(ordered.ok()) << ordered.status();
  EXPECT_EQ(ordered->state_bytes, 6 * (12 + 4 * 8));
  // (and the divergence's values per rank too)
  EXPECT_EQ(ordered->bookkeeping_bytes, f->bookkeeping_bytes + 2 * (2 * 4) * 3);

  v1::JobSpec huge = OneTensorSpec(1, 2);
  for (int i = 0; i < 2; ++i) {
    auto* t = huge.add_tensors();
    t->set_name(i == 0 ? "a" : "b");
    t->add_shape(int64_t{1} << 31);
    t->add_shape(int64_t{1} << 31);
  }
  ASSERT_TRUE(NormalizeJobSpec(&huge, 64 << 20).ok());
  EXPECT_EQ(ComputeJobFootprint(huge).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(CheckJobIdTest, AcceptsTheDocumentedCharactersAndLengths) {
  EXPECT_TRUE(CheckJobId("run-1_a.B").ok());
  EXPECT_TRUE(CheckJobId(std::string(kMaxJobIdBytes, 'x')).ok());
  EXPECT_EQ(CheckJobId("").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckJobId(std::string(kMaxJobIdBytes + 1, 'x')).code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status slash = CheckJobId("a/b");
  EXPECT_EQ(slash.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(slash.message(), "[A-Za-z0-9._-]")) << slash;
}

TEST(NormalizeJobSpecTest, NamesTheFieldItRefuses) {
  v1::JobSpec spec = OneTensorSpec(1, 4);
  spec.mutable_adamw()->set_beta1(1.0f);
  absl::Status s = NormalizeJobSpec(&spec, 64 << 20);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "betas")) << s;
  spec = OneTensorSpec(1, 4);
  spec.add_tensors()->set_name("w");
  s = NormalizeJobSpec(&spec, 64 << 20);
  EXPECT_TRUE(absl::StrContains(s.message(), "listed twice")) << s;
  spec = OneTensorSpec(1, 4);
  spec.mutable_zenflow()->set_select_interval(6);
  s = NormalizeJobSpec(&spec, 64 << 20);
  EXPECT_TRUE(absl::StrContains(s.message(), "select_interval")) << s;
}

// Two parts: part 0 holds "w" whole and the first block of "x"; part 1 the
// second block of "x".
v1::JobSpec PartZero() {
  v1::JobSpec spec = OneTensorSpec(1, 4);
  auto* x = spec.add_tensors();
  x->set_name("x");
  x->add_shape(2);
  x->add_shape(3);
  v1::Partition* p = spec.mutable_partition();
  p->set_version(1);
  p->set_parts(2);
  p->set_part(0);
  auto* w = p->add_tensors();
  w->set_tensor("w");
  w->set_part(0);
  auto* x0 = p->add_tensors();
  x0->set_tensor("x");
  x0->set_part(0);
  x0->set_first_column(0);
  x0->set_columns(3);
  auto* x1 = p->add_tensors();
  x1->set_tensor("x");
  x1->set_part(1);
  x1->set_first_column(3);
  x1->set_columns(5);
  return spec;
}

TEST(CheckPartitionTest, AcceptsAWellFormedMap) {
  v1::JobSpec spec = PartZero();
  const absl::Status s = NormalizeJobSpec(&spec, 64 << 20);
  EXPECT_TRUE(s.ok()) << s;
}

TEST(CheckPartitionTest, RefusesBlocksOutOfOrderAndUnusedParts) {
  v1::JobSpec gap = PartZero();
  gap.mutable_partition()->mutable_tensors(2)->set_first_column(4);
  absl::Status s = CheckPartition(gap);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "starts at column 4, not 3")) << s;

  v1::JobSpec unused = PartZero();
  unused.mutable_partition()->set_parts(3);
  s = CheckPartition(unused);
  EXPECT_TRUE(absl::StrContains(s.message(), "part 2 of 3 hosts no tensor")) << s;

  v1::JobSpec clipped = PartZero();
  clipped.mutable_adamw()->set_max_grad_norm(1.0f);
  s = CheckPartition(clipped);
  EXPECT_TRUE(absl::StrContains(s.message(), "max_grad_norm")) << s;
}

TEST(CheckPartitionTest, ThisPartsTensorsAreTheSpecsInOrder) {
  v1::JobSpec spec = PartZero();
  spec.mutable_tensors()->SwapElements(0, 1);
  const absl::Status s = CheckPartition(spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "in the same order")) << s;
}

TEST(ShapeStringTest, WritesTheDimensions) {
  v1::TensorSpec t;
  t.add_shape(2);
  t.add_shape(3);
  EXPECT_EQ(ShapeString(t.shape()), "[2, 3]");
}

}  // namespace
}  // namespace zenflow
