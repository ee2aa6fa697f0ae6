#include "server/tensor_store.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace zenflow {
namespace {

// Deterministic, distinct values everywhere.
void Fill(TensorStore& s, int t, float base) {
  const TensorStore::Shape& sh = s.shape(t);
  for (int64_t c = 0; c < sh.cols; ++c) {
    for (int64_t r = 0; r < sh.rows; ++r) {
      s.master(t, c)[r] = base + 0.001f * static_cast<float>(c * sh.rows + r);
      s.m(t, c)[r] = -0.5f * s.master(t, c)[r];
      s.v(t, c)[r] = 1e-7f * static_cast<float>(c + r + 1);
    }
    s.set_count(t, c, 3 + c);
  }
}

TEST(TensorStoreTest, LoadRowMajorTransposesIntoColumns) {
  TensorStore s({{3, 70}});
  std::vector<float> src(3 * 70);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i);
  s.LoadRowMajor(0, src.data());
  for (int64_t c = 0; c < 70; ++c) {
    for (int64_t r = 0; r < 3; ++r) EXPECT_EQ(s.master(0, c)[r], src[r * 70 + c]);
  }
}

// A reselection's hand-off both ways: the state read from one store and
// written into another is bit-identical, column by column, counts included,
// and nothing else changes.
TEST(TensorStoreTest, HandOffRoundTripIsBitIdentical) {
  TensorStore a({{8, 16}, {1, 5}}), b({{8, 16}, {1, 5}});
  Fill(a, 0, 1.0f);
  Fill(a, 1, 7.0f);
  const std::vector<int32_t> leaving = {9, 2, 15};
  v1::ColumnState state;
  a.ReadColumns(0, leaving, &state);
  ASSERT_TRUE(b.WellFormed(0, state));
  EXPECT_NE(b.FirstDifference(0, state), -1);
  b.WriteColumns(0, state);
  EXPECT_EQ(b.FirstDifference(0, state), -1);
  v1::ColumnState back;
  b.ReadColumns(0, leaving, &back);
  EXPECT_EQ(back.SerializeAsString(), state.SerializeAsString());
  for (int32_t c : leaving) {
    EXPECT_EQ(std::memcmp(a.master(0, c), b.master(0, c), 8 * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(a.m(0, c), b.m(0, c), 8 * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(a.v(0, c), b.v(0, c), 8 * sizeof(float)), 0);
    EXPECT_EQ(a.count(0, c), b.count(0, c));
  }
  EXPECT_EQ(b.master(0, 3)[0], 0.0f) << "a column not handed off changed";
  EXPECT_EQ(b.count(0, 3), 0);
  EXPECT_EQ(b.count(1, 0), 0) << "another tensor changed";
}

TEST(TensorStoreTest, FirstDifferenceFindsOneFlippedBit) {
  TensorStore s({{4, 6}});
  Fill(s, 0, 2.0f);
  v1::ColumnState state;
  s.ReadColumns(0, {1, 4, 5}, &state);
  EXPECT_EQ(s.FirstDifference(0, state), -1);
  uint32_t bits;
  std::memcpy(&bits, &state.m()[4 + 2], 4);  // column 4 (index 1), row 2
  bits ^= 1u;
  float flipped;
  std::memcpy(&flipped, &bits, 4);
  state.set_m(4 + 2, flipped);
  EXPECT_EQ(s.FirstDifference(0, state), 1);
  state.set_m(4 + 2, s.m(0, 4)[2]);
  state.set_update_counts(2, 99);
  EXPECT_EQ(s.FirstDifference(0, state), 2);
}

TEST(TensorStoreTest, WellFormedChecksSizesAndColumns) {
  TensorStore s({{2, 3}});
  v1::ColumnState state;
  s.ReadColumns(0, {0, 2}, &state);
  EXPECT_TRUE(s.WellFormed(0, state));
  v1::ColumnState short_v = state;
  short_v.mutable_v()->RemoveLast();
  EXPECT_FALSE(s.WellFormed(0, short_v));
  v1::ColumnState bad_col = state;
  bad_col.set_columns(1, 3);
  EXPECT_FALSE(s.WellFormed(0, bad_col));
  v1::ColumnState no_count = state;
  no_count.mutable_update_counts()->RemoveLast();
  EXPECT_FALSE(s.WellFormed(0, no_count));
}

}  // namespace
}  // namespace zenflow

namespace zenflow {
namespace {

// 8-bit state (rule 15): a store with 8-bit m and v hands out the
// dequantized values, and what it hands out comes back to the same codes:
// a reselection's round trip keeps the state exactly; tensors under 16 rows
// stay fp32.
TEST(TensorStoreTest, EightBitHandOffRoundTripKeepsTheCodes) {
  TensorStore a({{300, 4}, {8, 3}}, StateFormat::k8bit), b({{300, 4}, {8, 3}}, StateFormat::k8bit);
  EXPECT_TRUE(a.quantized(0));
  EXPECT_FALSE(a.quantized(1));
  v1::ColumnState given;
  for (int c = 0; c < 4; ++c) {
    given.add_columns(c);
    given.add_update_counts(3);
    for (int r = 0; r < 300; ++r) {
      given.add_values(0.5f * r - c);
      given.add_m(std::ldexp(1.0f, -(r % 20)) * (r % 3 == 0 ? -1.0f : 1.0f));
      given.add_v(std::ldexp(1.0f, -(r % 40)));
    }
  }
  a.WriteColumns(0, given);  // SetState: quantized
  v1::ColumnState out;
  a.ReadColumns(0, {0, 1, 2, 3}, &out);
  for (int i = 0; i < given.m_size(); ++i) {
    EXPECT_EQ(out.values(i), given.values(i)) << i;
    EXPECT_NEAR(out.m(i), given.m(i), std::fabs(given.m(i)) / 16 + 1e-5f) << i;
    EXPECT_GT(out.v(i), 0.0f) << i;
  }
  EXPECT_EQ(a.FirstDifference(0, out), -1);
  b.WriteColumns(0, out);
  v1::ColumnState back;
  b.ReadColumns(0, {0, 1, 2, 3}, &back);
  EXPECT_EQ(back.SerializeAsString(), out.SerializeAsString());
  std::vector<float> m(300), v(300);
  b.CopyMoments(0, 2, 1, m.data(), v.data());
  EXPECT_EQ(std::memcmp(m.data(), out.m().data() + 600, 300 * sizeof(float)), 0);
  // A value a code step away is a difference.
  v1::ColumnState off = out;
  off.set_m(310, off.m(310) * 1.2f);
  EXPECT_EQ(a.FirstDifference(0, off), 1);
}

}  // namespace
}  // namespace zenflow
