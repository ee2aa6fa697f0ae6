#include "common/selection.h"

#include "gtest/gtest.h"

namespace zenflow {
namespace {

TEST(TopKCountTest, CeilOfRatioTimesColumns) {
  EXPECT_EQ(TopKCount(0.1f, 10), 1);
  EXPECT_EQ(TopKCount(0.1f, 11), 2);
  EXPECT_EQ(TopKCount(0.1f, 4096), 410);
  EXPECT_EQ(TopKCount(0.05f, 100), 5);
  EXPECT_EQ(TopKCount(0.0f, 100), 0);
  EXPECT_EQ(TopKCount(1.0f, 100), 100);
  EXPECT_EQ(TopKCount(0.5f, 3), 2);
  EXPECT_EQ(TopKCount(2.0f, 3), 3);
}

TEST(SelectTopKTest, LargestScoresAscendingIndices) {
  std::vector<float> s = {0.5f, 3.0f, 1.0f, 7.0f, 2.0f};
  EXPECT_EQ(SelectTopK(s, 2), (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(SelectTopK(s, 0), (std::vector<int32_t>{}));
  EXPECT_EQ(SelectTopK(s, 9), (std::vector<int32_t>{0, 1, 2, 3, 4}));
}

TEST(SelectTopKTest, TiesGoToLowerIndex) {
  std::vector<float> s = {1.0f, 2.0f, 2.0f, 2.0f, 0.0f, 2.0f};
  EXPECT_EQ(SelectTopK(s, 2), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(SelectTopK(s, 3), (std::vector<int32_t>{1, 2, 3}));
  std::vector<float> zeros(8, 0.0f);
  EXPECT_EQ(SelectTopK(zeros, 3), (std::vector<int32_t>{0, 1, 2}));
}

}  // namespace
}  // namespace zenflow
