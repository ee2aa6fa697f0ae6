#include "server/round_accumulator.h"

#include <vector>

#include "common/codec.h"
#include "gtest/gtest.h"

namespace zenflow {
namespace {

float G(int rank, int64_t step, int64_t r, int64_t c) {
  return 0.25f * static_cast<float>(rank + 1) - 0.125f * static_cast<float>(step) +
         0.01f * static_cast<float>(r) - 0.003f * static_cast<float>(c);
}

// Two ranks x four steps of one round, each step's shard decoded into the
// round's sum in arrival order: the sum (and so the mean the update forms)
// is the plain fp32 sum in that order, and every column has four steps from
// each rank.
TEST(RoundAccumulatorTest, TwoRanksFourStepsAccumulateToTheMean) {
  constexpr int64_t kRows = 3, kCols = 5;
  RoundAccumulator acc({{kRows, kCols}}, /*world=*/2);
  std::vector<float> want(kRows * kCols, 0.0f);
  for (int64_t step = 4; step < 8; ++step) {  // round 1
    for (int rank = 0; rank < 2; ++rank) {
      for (int32_t c = 0; c < kCols; ++c) {
        ASSERT_FALSE(acc.Received(0, rank, step, c));
        std::vector<float> col(kRows);
        for (int64_t r = 0; r < kRows; ++r) {
          col[r] = G(rank, step, r, c);
          want[c * kRows + r] += col[r];
        }
        DecodeAdd(DType::kF32, col.data(), kRows, acc.sum(0, /*round=*/1, c));
        acc.MarkReceived(0, rank, step, c);
        EXPECT_TRUE(acc.Received(0, rank, step, c)) << "a repeat is detected";
      }
    }
  }
  for (int32_t c = 0; c < kCols; ++c) {
    for (int rank = 0; rank < 2; ++rank) EXPECT_EQ(acc.hits(0, rank, c), 4);
    for (int64_t r = 0; r < kRows; ++r) {
      EXPECT_EQ(acc.sum(0, 1, c)[r], want[c * kRows + r]);
      EXPECT_FLOAT_EQ(acc.sum(0, 1, c)[r] / 8.0f, want[c * kRows + r] / 8.0f);
      EXPECT_EQ(acc.sum(0, 0, c)[r], 0.0f) << "round 0's buffer is another one";
      EXPECT_EQ(acc.sum(0, 2, c)[r], 0.0f) << "round 2 starts where round 0 ended";
    }
  }
  acc.ResetRank(0);
  EXPECT_EQ(acc.hits(0, 0, 2), 0);
  EXPECT_EQ(acc.hits(0, 1, 2), 4);
  acc.Clear(0, 1, /*first=*/1, /*n=*/2);
  EXPECT_EQ(acc.sum(0, 1, 1)[0], 0.0f);
  EXPECT_EQ(acc.sum(0, 1, 2)[kRows - 1], 0.0f);
  EXPECT_EQ(acc.sum(0, 1, 3)[0], want[3 * kRows]) << "Clear went past its columns";
  EXPECT_EQ(acc.sum(0, 1, 0)[kRows - 1], want[kRows - 1]);
}

TEST(RoundAccumulatorTest, StagingIsTheOddRoundsBufferAndClears) {
  RoundAccumulator acc({{2, 4}}, 1);
  float* s = acc.staging(0);
  for (int i = 0; i < 8; ++i) s[i] = 1.0f + i;
  EXPECT_EQ(acc.sum(0, 1, 0), s);
  acc.ClearStaging(0, 5);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(s[i], 0.0f);
  EXPECT_EQ(s[5], 6.0f);
  acc.ClearStaging(0, 8);
  EXPECT_EQ(s[7], 0.0f);
}

}  // namespace
}  // namespace zenflow
