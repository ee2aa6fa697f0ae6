// PredictedStep: when a step has one, and the daemon's AdamW step it runs
// on the daemon's columns (from the zero state and from a delta's state),
// checked against common/adamw.h's reference on the CPU backend.
#include "gpu_worker/engine/predicted_step.h"

#include <cmath>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "common/adamw.h"
#include "common/codec.h"
#include "gpu_worker/backend.h"
#include "gpu_worker/engine/engine_tensor.h"
#include "gpu_worker/engine/round_policy.h"
#include "gtest/gtest.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {
namespace {

TEST(PredictedStepDecideTest, OnlyOneStepRoundsAppliedOneStepLate) {
  const std::deque<PendingRound> none;
  EXPECT_TRUE(PredictedStep::Decide(true, 0, 1, none));
  EXPECT_FALSE(PredictedStep::Decide(false, 0, 1, none));
  EXPECT_FALSE(PredictedStep::Decide(true, 0, 2, none));
  // Step 5: round 4 (step 4, one step, delay 1) is applied at its end.
  std::deque<PendingRound> one{{4, 4, 1, 1}};
  EXPECT_TRUE(PredictedStep::Decide(true, 5, 1, one));
  EXPECT_FALSE(PredictedStep::Decide(true, 6, 1, one));  // not the step before
  one.front().delay = 2;
  EXPECT_FALSE(PredictedStep::Decide(true, 5, 1, one));
  one.front() = {4, 4, 1, 2};  // a two-step round
  EXPECT_FALSE(PredictedStep::Decide(true, 5, 1, one));
  // Drained (a selection step): nothing in flight.
  EXPECT_FALSE(PredictedStep::Decide(true, 5, 1, none));
  const std::deque<PendingRound> two{{3, 3, 1, 1}, {4, 4, 1, 1}};
  EXPECT_FALSE(PredictedStep::Decide(true, 5, 1, two));
}

constexpr int64_t kRows = 3, kCols = 4;

class PredictedStepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = worker::MakeCpuBackend(1);
    adamw_.set_beta1(0.9f);
    adamw_.set_beta2(0.999f);
    adamw_.set_eps(1e-8f);
    adamw_.set_weight_decay(0.01f);
    auto t = std::make_unique<EngineTensor>();
    t->name = "w";
    t->rows = kRows;
    t->cols = kCols;
    ASSERT_TRUE(param_.Reserve(backend_.get(), kRows * kCols * 4).ok());
    ASSERT_TRUE(grad_.Reserve(backend_.get(), kRows * kCols * 4).ok());
    for (int64_t i = 0; i < kRows * kCols; ++i) {
      param_.f32()[i] = 0.5f - 0.07f * static_cast<float>(i);
      grad_.f32()[i] = 0.3f * std::sin(static_cast<float>(i) + 1.0f);
    }
    t->param = param_.p();
    t->grad = grad_.f32();
    ASSERT_TRUE(t->d_important.Reserve(backend_.get(), kCols * 4).ok());
    ASSERT_TRUE(t->d_remote.Reserve(backend_.get(), kCols * 4).ok());
    ASSERT_TRUE(SetImportantColumns(backend_.get(), *t, {1}).ok());
    ASSERT_EQ(t->remote, (std::vector<int32_t>{0, 2, 3}));
    tensors_.push_back(std::move(t));
    before_.assign(param_.f32(), param_.f32() + kRows * kCols);
  }

  // The reference's AdamW step of column c from (m, v) at update `step`.
  float Expected(int32_t c, int64_t r, int64_t step, float m, float v) const {
    const AdamWHyper h{kLr, adamw_.beta1(), adamw_.beta2(), adamw_.eps(), adamw_.weight_decay()};
    float p = before_[r * kCols + c];
    const float g = grad_.f32()[r * kCols + c];
    AdamWReference(h, step, 1.0f, &g, &p, &m, &v, 1);
    return p;
  }

  static constexpr float kLr = 1e-2f;
  std::unique_ptr<worker::Backend> backend_;
  v1::AdamWConfig adamw_;
  worker::DeviceBuffer param_, grad_;
  std::vector<std::unique_ptr<EngineTensor>> tensors_;
  std::vector<float> before_;
};

TEST_F(PredictedStepTest, FromZeroIsTheDaemonsFirstStep) {
  PredictedStep predicted(backend_.get(), adamw_, true);
  predicted.Begin(true, kLr);
  ASSERT_TRUE(predicted.Pack(tensors_).ok());
  ASSERT_TRUE(predicted.FromZero(tensors_).ok());
  for (int64_t r = 0; r < kRows; ++r) {
    for (int32_t c = 0; c < kCols; ++c) {
      const float got = param_.f32()[r * kCols + c];
      if (c == 1) {  // important: the worker's own update, not this one
        EXPECT_EQ(got, before_[r * kCols + c]);
        continue;
      }
      const float want = Expected(c, r, 1, 0, 0);
      EXPECT_NE(got, before_[r * kCols + c]);
      EXPECT_NEAR(got, want, 1e-6f * std::fabs(want) + 1e-7f) << "row " << r << " col " << c;
    }
  }
  EXPECT_TRUE(predicted.End(0));
  EXPECT_FALSE(predicted.now());
}

TEST_F(PredictedStepTest, FromDeltaContinuesTheDaemonsState) {
  PredictedStep predicted(backend_.get(), adamw_, true);
  predicted.Begin(true, kLr);
  ASSERT_TRUE(predicted.Pack(tensors_).ok());
  // A delta of columns 2 and 3 with their state after 4 and 6 updates.
  v1::ParameterDelta d;
  d.set_round(7);
  d.set_tensor("w");
  d.add_columns(2);
  d.add_columns(3);
  d.add_update_counts(4);
  d.add_update_counts(6);
  std::vector<float> m(2 * kRows), v(2 * kRows);
  for (size_t i = 0; i < m.size(); ++i) {
    m[i] = 0.01f * static_cast<float>(i + 1);
    v[i] = 0.002f * static_cast<float>(i + 1);
  }
  std::string mb(m.size() * 2, '\0'), vb(v.size() * 2, '\0');
  Encode(DType::kBF16, m.data(), m.size(), mb.data());
  Encode(DType::kBF16, v.data(), v.size(), vb.data());
  Decode(DType::kBF16, mb.data(), m.size(), m.data());  // what the step sees
  Decode(DType::kBF16, vb.data(), v.size(), v.data());
  d.set_m(mb);
  d.set_v(vb);
  const PendingRound p{7, 7, 1, 1};
  EXPECT_TRUE(predicted.Carries(p, 8, d));
  EXPECT_FALSE(predicted.Carries(p, 9, d));
  const std::vector<int32_t> cols{2, 3};
  ASSERT_TRUE(predicted.FromDelta(tensors_[0].get(), d, cols.data()).ok());
  for (int64_t r = 0; r < kRows; ++r) {
    for (int32_t c = 0; c < kCols; ++c) {
      const float got = param_.f32()[r * kCols + c];
      if (c < 2) {
        EXPECT_EQ(got, before_[r * kCols + c]);
        continue;
      }
      const int k = c - 2;  // the message's column
      const float want = Expected(c, r, k == 0 ? 5 : 7, m[k * kRows + r], v[k * kRows + r]);
      EXPECT_NEAR(got, want, 1e-6f * std::fabs(want) + 1e-7f) << "row " << r << " col " << c;
    }
  }
  EXPECT_TRUE(predicted.End(8));
}

TEST_F(PredictedStepTest, RefusesAMalformedOrForeignDelta) {
  PredictedStep predicted(backend_.get(), adamw_, true);
  predicted.Begin(true, kLr);
  ASSERT_TRUE(predicted.Pack(tensors_).ok());
  v1::ParameterDelta d;
  d.set_tensor("w");
  d.add_columns(1);  // the rank's own column, not a daemon one
  d.add_update_counts(1);
  d.set_m(std::string(kRows * 2, '\0'));
  d.set_v(std::string(kRows * 2, '\0'));
  const int32_t col = 1;
  EXPECT_EQ(predicted.FromDelta(tensors_[0].get(), d, &col).code(), absl::StatusCode::kInternal);
  d.set_m(std::string(kRows, '\0'));  // half the state
  d.set_columns(0, 0);
  EXPECT_EQ(predicted.FromDelta(tensors_[0].get(), d, &col).code(), absl::StatusCode::kInternal);
  // Nothing predicted from: step 3 did not end with a predicted step.
  EXPECT_FALSE(predicted.End(3));
  EXPECT_EQ(param_.f32()[0], before_[0]);
}

}  // namespace
}  // namespace zenflow
