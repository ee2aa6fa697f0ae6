// LocalStep (docs/design.md rule 13): when a step has one, the factored
// moment it takes from the deltas, and the step it runs on the daemon's
// columns on the CPU backend, checked against the formula written out here.
#include "gpu_worker/engine/local_step.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include "common/codec.h"
#include "gpu_worker/backend.h"
#include "gpu_worker/engine/engine_tensor.h"
#include "gpu_worker/engine/round_policy.h"
#include "gtest/gtest.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {
namespace {

constexpr int64_t kRows = 3, kCols = 4;
constexpr float kLr = 0.05f, kEps = 1e-3f;

v1::JobSpec Spec() {
  v1::JobSpec spec;
  spec.set_mode(v1::MODE_ZENFLOW);
  spec.mutable_adamw()->set_eps(kEps);
  spec.mutable_zenflow()->mutable_apply_delay()->set_steps(1);
  return spec;
}

TEST(LocalStepOptionTest, OnByDefaultForZenFlowValuesOnly) {
  v1::JobSpec spec = Spec();
  EXPECT_TRUE(LocalStep::EnabledFor(spec));  // unset: the default
  spec.mutable_zenflow()->set_local_step(false);
  EXPECT_FALSE(LocalStep::EnabledFor(spec));
  spec.mutable_zenflow()->set_local_step(true);
  EXPECT_TRUE(LocalStep::EnabledFor(spec));
  spec.set_delta_kind(v1::DELTA_ARITHMETIC);
  EXPECT_FALSE(LocalStep::EnabledFor(spec));
  spec = Spec();
  spec.set_mode(v1::MODE_ZERO_OFFLOAD);
  EXPECT_FALSE(LocalStep::EnabledFor(spec));
}

class LocalStepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = worker::MakeCpuBackend(1);
    Make(DType::kF32);
  }

  // One [kRows, kCols] tensor of `dtype`, column 1 important, 0, 2 and 3
  // the daemon's, with their (reduced) gradients packed into pbuf.
  void Make(DType dtype) {
    tensors_.clear();
    auto t = std::make_unique<EngineTensor>();
    t->name = "w";
    t->rows = kRows;
    t->cols = kCols;
    t->dtype = dtype;
    before_.resize(kRows * kCols);
    for (int64_t i = 0; i < kRows * kCols; ++i) before_[i] = 0.5f - 0.07f * static_cast<float>(i);
    ASSERT_TRUE(param_.Reserve(backend_.get(), kRows * kCols * 4).ok());
    Encode(dtype, before_.data(), before_.size(), param_.p());
    Decode(dtype, param_.p(), before_.size(), before_.data());  // as the tensor holds them
    t->param = param_.p();
    ASSERT_TRUE(t->d_important.Reserve(backend_.get(), kCols * 4).ok());
    ASSERT_TRUE(t->d_remote.Reserve(backend_.get(), kCols * 4).ok());
    ASSERT_TRUE(SetImportantColumns(backend_.get(), *t, {1}).ok());
    ASSERT_EQ(t->remote, (std::vector<int32_t>{0, 2, 3}));
    ASSERT_TRUE(t->pbuf.Reserve(backend_.get(), kRows * 3 * 4).ok());
    for (int64_t k = 0; k < 3; ++k) {
      for (int64_t r = 0; r < kRows; ++r) {
        t->pbuf.f32()[k * kRows + r] = 0.3f * std::sin(static_cast<float>(k * kRows + r) + 1.0f);
      }
    }
    tensors_.push_back(std::move(t));
  }

  EngineTensor& T() { return *tensors_[0]; }
  float Param(int64_t i) {
    float x;
    Decode(T().dtype, static_cast<char*>(param_.p()) + i * DTypeSize(T().dtype), 1, &x);
    return x;
  }

  // A delta of round 3 for `columns` with row moments {4e-4, 0, 1e-4}
  // (row 1 never had a gradient) and column moments 1e-4 * (c + 1).
  static v1::ParameterDelta Delta(std::vector<int32_t> columns) {
    v1::ParameterDelta d;
    d.set_round(3);
    d.set_tensor("w");
    for (int32_t c : columns) {
      d.add_columns(c);
      d.add_col_v(1e-4f * static_cast<float>(c + 1));
    }
    for (float x : {4e-4f, 0.0f, 1e-4f}) d.add_row_v(x);
    d.set_v_mean(2e-4f);
    return d;
  }

  // The rule's formula for element (r, column c at daemon position k),
  // from the value before the step, rounded to the tensor's dtype.
  float Expected(int64_t r, int32_t c, int64_t k) {
    const float row_v[] = {4e-4f, 0.0f, 1e-4f};
    const float vh = row_v[r] * (1e-4f * static_cast<float>(c + 1)) / 2e-4f;
    const float x = before_[r * kCols + c];
    if (!(vh > 0)) return x;
    const float y = x - kLr * T().pbuf.f32()[k * kRows + r] / (std::sqrt(vh) + kEps);
    float out;
    std::vector<char> raw(4);
    Encode(T().dtype, &y, 1, raw.data());
    Decode(T().dtype, raw.data(), 1, &out);
    return out;
  }

  void ExpectStepped() {
    const int32_t remote[] = {0, 2, 3};
    for (int64_t k = 0; k < 3; ++k) {
      for (int64_t r = 0; r < kRows; ++r) {
        const int32_t c = remote[k];
        EXPECT_EQ(Param(r * kCols + c), Expected(r, c, k)) << "row " << r << " column " << c;
      }
    }
    for (int64_t r = 0; r < kRows; ++r) {
      EXPECT_EQ(Param(r * kCols + 1), before_[r * kCols + 1]) << "the important column moved";
    }
  }

  std::unique_ptr<worker::Backend> backend_;
  worker::DeviceBuffer param_;
  std::vector<float> before_;
  std::vector<std::unique_ptr<EngineTensor>> tensors_;
};

TEST_F(LocalStepTest, DecidesAtTheStepStart) {
  LocalStep local(backend_.get(), Spec());
  const std::deque<PendingRound> none;
  // No factored moment and nothing due: no step (no gradients reduced).
  EXPECT_FALSE(local.Decide(5, false, false, false, none));
  // Round 4 (closed at step 4, delay 1) is applied at step 5's end.
  std::deque<PendingRound> due{{4, 4, 1, 1}};
  EXPECT_TRUE(local.Decide(5, false, false, false, due));
  EXPECT_FALSE(local.Decide(5, /*selection=*/true, false, false, due));
  EXPECT_FALSE(local.Decide(5, false, /*predicted=*/true, false, due));
  due.front().delay = 2;  // applied at step 6
  EXPECT_FALSE(local.Decide(5, false, false, false, due));
  due.front().delay = -1;  // not decided: not due
  EXPECT_FALSE(local.Decide(5, false, false, false, due));
  // With a moment in hand, every step but the excluded ones.
  ASSERT_TRUE(local.FromDelta(T(), Delta({0, 2, 3})).ok());
  EXPECT_TRUE(local.Decide(6, false, false, false, none));
  EXPECT_TRUE(local.Decide(6, false, false, /*closes_round=*/true, none));  // not sync
  EXPECT_FALSE(local.Decide(6, true, false, false, none));
  local.Reset();
  EXPECT_FALSE(local.Decide(6, false, false, false, none));
  v1::JobSpec off = Spec();
  off.mutable_zenflow()->set_local_step(false);
  EXPECT_FALSE(LocalStep(backend_.get(), off).Decide(5, false, false, false, {{4, 4, 1, 1}}));
}

TEST_F(LocalStepTest, SyncSkipsTheStepThatClosesARound) {
  v1::JobSpec spec = Spec();
  spec.mutable_zenflow()->mutable_apply_delay()->set_sync(true);
  LocalStep local(backend_.get(), spec);
  ASSERT_TRUE(local.FromDelta(T(), Delta({0, 2, 3})).ok());
  EXPECT_TRUE(local.Decide(6, false, false, false, {}));
  EXPECT_FALSE(local.Decide(7, false, false, /*closes_round=*/true, {}));
}

TEST_F(LocalStepTest, StepsTheDaemonColumnsOnceEveryColumnHasItsMoment) {
  LocalStep local(backend_.get(), Spec());
  // The first message covers columns 0 and 2: not ready, no step.
  ASSERT_TRUE(local.FromDelta(T(), Delta({0, 2})).ok());
  EXPECT_FALSE(local.Ready(T()));
  local.Begin(true, kLr);
  absl::StatusOr<bool> stepped = local.End(tensors_);
  ASSERT_TRUE(stepped.ok()) << stepped.status();
  EXPECT_FALSE(*stepped);
  for (int64_t i = 0; i < kRows * kCols; ++i) ASSERT_EQ(Param(i), before_[i]);
  // The second covers column 3.
  ASSERT_TRUE(local.FromDelta(T(), Delta({3})).ok());
  EXPECT_TRUE(local.Ready(T()));
  local.Begin(true, kLr);
  EXPECT_TRUE(local.now());
  stepped = local.End(tensors_);
  ASSERT_TRUE(stepped.ok()) << stepped.status();
  EXPECT_TRUE(*stepped);
  EXPECT_FALSE(local.now());
  ExpectStepped();
  // Row 1's moment is 0: its elements have no scale and keep their values.
  EXPECT_EQ(Param(1 * kCols + 0), before_[1 * kCols + 0]);
  EXPECT_NE(Param(0 * kCols + 0), before_[0 * kCols + 0]);
  // A step that decided against it does nothing.
  local.Begin(false, kLr);
  stepped = local.End(tensors_);
  ASSERT_TRUE(stepped.ok());
  EXPECT_FALSE(*stepped);
}

TEST_F(LocalStepTest, Bf16ParametersAreSteppedInFp32AndRounded) {
  Make(DType::kBF16);
  LocalStep local(backend_.get(), Spec());
  ASSERT_TRUE(local.FromDelta(T(), Delta({0, 2, 3})).ok());
  local.Begin(true, kLr);
  absl::StatusOr<bool> stepped = local.End(tensors_);
  ASSERT_TRUE(stepped.ok()) << stepped.status();
  EXPECT_TRUE(*stepped);
  ExpectStepped();
}

TEST_F(LocalStepTest, DeltasWithoutAMomentChangeNothing) {
  LocalStep local(backend_.get(), Spec());
  v1::ParameterDelta d = Delta({0, 2, 3});
  d.clear_row_v();
  d.clear_col_v();
  ASSERT_TRUE(local.FromDelta(T(), d).ok());
  EXPECT_FALSE(local.Ready(T()));
  // With the option off, a moment that comes anyway is ignored.
  v1::JobSpec off = Spec();
  off.mutable_zenflow()->set_local_step(false);
  LocalStep disabled(backend_.get(), off);
  ASSERT_TRUE(disabled.FromDelta(T(), Delta({0, 2, 3})).ok());
  EXPECT_FALSE(disabled.Ready(T()));
}

// A tensor split over two daemons: each sends the moment of its own columns
// (here {0, 2} with row moments r and {3} with 4r); the ranks step with their
// column-weighted mean (2r + 4r) / 3 = 2r whichever arrives first, and a new
// round's messages replace the old round's.
TEST_F(LocalStepTest, SplitMomentsCombineByColumnsInAnyOrder) {
  auto part = [](std::vector<int32_t> columns, float scale, int64_t round) {
    v1::ParameterDelta d = Delta(std::move(columns));
    d.set_round(round);
    for (int i = 0; i < d.row_v_size(); ++i) d.set_row_v(i, d.row_v(i) * scale);
    d.set_v_mean(d.v_mean() * scale);
    return d;
  };
  std::vector<std::vector<float>> results;
  for (bool reversed : {false, true}) {
    Make(DType::kF32);
    LocalStep local(backend_.get(), Spec());
    // An older round's single message, replaced by round 3's two.
    ASSERT_TRUE(local.FromDelta(T(), part({0, 2, 3}, 100.0f, 2)).ok());
    if (reversed) {
      ASSERT_TRUE(local.FromDelta(T(), part({3}, 4.0f, 3)).ok());
      ASSERT_TRUE(local.FromDelta(T(), part({0, 2}, 1.0f, 3)).ok());
    } else {
      ASSERT_TRUE(local.FromDelta(T(), part({0, 2}, 1.0f, 3)).ok());
      ASSERT_TRUE(local.FromDelta(T(), part({3}, 4.0f, 3)).ok());
    }
    local.Begin(true, kLr);
    ASSERT_TRUE(local.End(tensors_).ok());
    results.emplace_back(param_.f32(), param_.f32() + kRows * kCols);
  }
  EXPECT_EQ(results[0], results[1]) << "the order of the messages changed the step";
  // The combined moment is the one-daemon Delta's with row_v and v_mean
  // doubled, exactly (in double: (2 * 1 + 1 * 4) / 3 = 2).
  Make(DType::kF32);
  LocalStep whole(backend_.get(), Spec());
  ASSERT_TRUE(whole.FromDelta(T(), part({0, 2, 3}, 2.0f, 3)).ok());
  whole.Begin(true, kLr);
  ASSERT_TRUE(whole.End(tensors_).ok());
  const std::vector<float> want(param_.f32(), param_.f32() + kRows * kCols);
  EXPECT_EQ(results[0], want);
}

TEST_F(LocalStepTest, AMomentThatDoesNotFitIsAnInternalError) {
  LocalStep local(backend_.get(), Spec());
  v1::ParameterDelta d = Delta({0, 2, 3});
  d.add_row_v(1.0f);  // four rows' moments for three rows
  absl::Status s = local.FromDelta(T(), d);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  d = Delta({0, 2, 3});
  d.add_col_v(1.0f);
  EXPECT_EQ(local.FromDelta(T(), d).code(), absl::StatusCode::kInternal);
  s = local.FromDelta(T(), Delta({1}));  // an important column
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("not a daemon column"), std::string::npos) << s;
  EXPECT_FALSE(local.Ready(T()));
}

}  // namespace
}  // namespace zenflow
