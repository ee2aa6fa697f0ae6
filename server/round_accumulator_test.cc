#include "server/round_accumulator.h"

#include <algorithm>
#include <cmath>
#include <string>
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
  RoundAccumulator acc({{kRows, kCols}}, /*world=*/2, /*rank_ordered=*/false);
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
  RoundAccumulator acc({{2, 4}}, 1, false);
  float* s = acc.staging(0);
  for (int i = 0; i < 8; ++i) s[i] = 1.0f + i;
  EXPECT_EQ(acc.sum(0, 1, 0), s);
  acc.ClearStaging(0, 5);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(s[i], 0.0f);
  EXPECT_EQ(s[5], 6.0f);
  acc.ClearStaging(0, 8);
  EXPECT_EQ(s[7], 0.0f);
}

// One column, three ranks, two steps each: the values are chosen so that
// fp32 addition in different orders gives different sums (1e8 absorbs a
// 1 added after it but not 1 + 1 added first).
constexpr float kStepValue[3][2] = {{1e8f, 1.0f}, {1.0f, -1e8f}, {1.0f, 3.0f}};

// Adds every rank's two steps in the order `ranks` lists the arrivals (each
// rank's own steps stay in order, as they do on a stream), then folds.
float ArrivalSum(bool rank_ordered, const std::vector<int>& ranks) {
  RoundAccumulator acc({{1, 1}}, /*world=*/3, rank_ordered);
  int next[3] = {0, 0, 0};
  for (int rank : ranks) {
    const int step = next[rank]++;
    acc.sum_of(0, rank, /*round=*/0, 0)[0] += kStepValue[rank][step];
    acc.MarkReceived(0, rank, step, 0);
  }
  acc.Fold(SimdLevel::kScalar, 0, 0, 0, 1);
  return acc.sum(0, 0, 0)[0];
}

TEST(RoundAccumulatorTest, RankOrderedSumsDoNotDependOnArrivalOrder) {
  const std::vector<std::vector<int>> orders = {
      {0, 0, 1, 1, 2, 2}, {2, 2, 1, 1, 0, 0}, {1, 0, 2, 1, 0, 2}, {0, 1, 1, 0, 2, 2}};
  // Rank order: ((1e8 + 1) + (1 + -1e8)) + (1 + 3) = (1e8 - 1e8) + 4.
  const float want = (((1e8f + 1.0f) + (1.0f + -1e8f)) + (1.0f + 3.0f));
  for (const auto& order : orders) EXPECT_EQ(ArrivalSum(true, order), want);
  // The shared buffer's sum follows arrival: these orders give other sums,
  // which is what rank_ordered_sums is for.
  std::vector<float> shared;
  for (const auto& order : orders) shared.push_back(ArrivalSum(false, order));
  EXPECT_NE(shared[0], shared[1]);
}

// Folding ranks as they close, in pieces of the rank order (as
// Job::FoldClosedRanksLocked does), gives the bits of one fold of them all,
// touches only that round, and zeroes what it folded.
TEST(RoundAccumulatorTest, FoldRanksInPiecesIsOneFold) {
  constexpr int kWorld = 5;
  const std::vector<TensorStore::Shape> shapes = {{3, 700}, {1, 9}};
  auto fill = [&](RoundAccumulator* acc) {
    for (int t = 0; t < 2; ++t) {
      for (int r = 0; r < kWorld; ++r) {
        for (int parity = 0; parity < 2; ++parity) {
          std::vector<float>& b = acc->sum_buffer(t, r, parity);
          for (size_t i = 0; i < b.size(); ++i) {
            b[i] = (r % 2 == 0 ? 1e8f : 1.0f) * static_cast<float>((i * 7 + r * 3 + parity) % 11) -
                   3e7f * static_cast<float>(r == 3);
          }
        }
      }
    }
  };
  RoundAccumulator whole(shapes, kWorld, true);
  fill(&whole);
  for (int t = 0; t < 2; ++t) whole.Fold(SimdLevel::kScalar, t, /*round=*/3, 0, shapes[t].cols);
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (!SimdLevelSupported(level)) continue;
    SCOPED_TRACE(SimdLevelName(level));
    RoundAccumulator pieces(shapes, kWorld, true);
    fill(&pieces);
    pieces.FoldRanks(level, 3, 0, 2);  // ranks 0 and 1 closed
    pieces.FoldRanks(level, 3, 2, 3);
    pieces.FoldRanks(level, 3, 3, kWorld);  // 4 closed before 3: both at 3's close
    for (int t = 0; t < 2; ++t) {
      EXPECT_EQ(pieces.sum_buffer(t, 0, 1), whole.sum_buffer(t, 0, 1));
      // The parts only read: their next round's first adds store.
      for (int r = 1; r < kWorld; ++r) {
        EXPECT_EQ(pieces.sum_buffer(t, r, 1), whole.sum_buffer(t, r, 1)) << "rank " << r;
      }
      EXPECT_EQ(pieces.sum_buffer(t, 2, 0), whole.sum_buffer(t, 2, 0)) << "the other round";
    }
    // The update's pass over folded sums: the squares alone, as FoldNorm's.
    RoundAccumulator again(shapes, kWorld, true);
    fill(&again);
    const BlockSquares a = again.FoldNorm(SimdLevel::kScalar, 0, 3, 10, 50);
    const BlockSquares b = pieces.FoldNorm(SimdLevel::kScalar, 0, 3, 10, 50, /*first_rank=*/kWorld);
    EXPECT_EQ(a.sum, b.sum);
    EXPECT_EQ(a.largest, b.largest);
  }
}

TEST(RoundAccumulatorTest, FoldAndClearTouchOnlyTheirColumnsAndRound) {
  RoundAccumulator acc({{2, 3}}, /*world=*/2, /*rank_ordered=*/true);
  EXPECT_EQ(acc.sum_ranks(), 2);
  for (int64_t round : {0, 1}) {
    for (int rank : {0, 1}) {
      for (int64_t c = 0; c < 3; ++c) {
        float* s = acc.sum_of(0, rank, round, c);
        EXPECT_NE(s, acc.sum_of(0, 1 - rank, round, c)) << "ranks share a buffer";
        s[0] = s[1] = static_cast<float>(10 * rank + c + 100 * round);
      }
    }
  }
  EXPECT_TRUE(acc.first_add_stores());
  acc.Fold(BestSimdLevel(), 0, /*round=*/1, /*first=*/1, /*n=*/2);
  for (int64_t c = 1; c < 3; ++c) {
    EXPECT_EQ(acc.sum(0, 1, c)[1], static_cast<float>(2 * (c + 100) + 10));
    EXPECT_EQ(acc.sum_of(0, 1, 1, c)[0], static_cast<float>(110 + c))
        << "Fold only reads rank 1's part";
  }
  EXPECT_EQ(acc.sum(0, 1, 0)[0], 100.0f) << "Fold went past its columns";
  EXPECT_EQ(acc.sum_of(0, 1, 1, 0)[0], 110.0f);
  EXPECT_EQ(acc.sum(0, 0, 1)[0], 1.0f) << "Fold touched the other round";
  // Each rank's buffer of its own: nothing to zero (the first adds store).
  acc.Clear(0, 0, 0, 3);
  for (int64_t c = 0; c < 3; ++c) {
    EXPECT_EQ(acc.sum_of(0, 0, 0, c)[1], static_cast<float>(c));
    EXPECT_EQ(acc.sum_of(0, 1, 0, c)[1], static_cast<float>(10 + c));
  }
  // Without rank order every rank adds into rank 0's buffer, which the
  // update's Clear zeroes (its columns, its round only).
  RoundAccumulator shared({{2, 3}}, 2, false);
  EXPECT_EQ(shared.sum_ranks(), 1);
  EXPECT_FALSE(shared.first_add_stores());
  EXPECT_EQ(shared.sum_of(0, 1, 0, 2), shared.sum(0, 0, 2));
  for (int64_t round : {0, 1}) {
    for (int64_t c = 0; c < 3; ++c) shared.sum(0, round, c)[0] = shared.sum(0, round, c)[1] = 7;
  }
  shared.Clear(0, 0, 1, 2);
  EXPECT_EQ(shared.sum(0, 0, 0)[1], 7.0f) << "Clear went past its columns";
  for (int64_t c = 1; c < 3; ++c) EXPECT_EQ(shared.sum(0, 0, c)[1], 0.0f);
  for (int64_t c = 0; c < 3; ++c) EXPECT_EQ(shared.sum(0, 1, c)[0], 7.0f) << "the other round";
  // One rank: its buffer is its own.
  EXPECT_TRUE(RoundAccumulator({{2, 3}}, 1, false).first_add_stores());
}

// The fused fold and squares: at every level the totals are the rank-order
// float sums, the parts are only read, and the squares' sum and the largest
// magnitude are the same bits as the scalar lanes' (tails included); the
// fold alone (FoldParts) gives the same totals.
TEST(RoundAccumulatorTest, FoldSquaresIsTheSameAtEveryLevel) {
  for (int nparts : {0, 1, 3}) {
    for (size_t n : {size_t{0}, size_t{5}, size_t{32}, size_t{77}, size_t{1000}, size_t{2500}}) {
      auto input = [&](int r, size_t i) {
        return 1e-3f * static_cast<float>((i * 37 + r * 11) % 201) - 0.1f +
               (r == 1 ? 3e-8f : 0.0f) * static_cast<float>(i);
      };
      // The reference: sequential float adds, lane i % 32 in double.
      std::vector<float> want(n);
      double lane[kSquareLanes] = {};
      float big = 0;
      for (size_t i = 0; i < n; ++i) {
        float x = input(0, i);
        for (int r = 1; r <= nparts; ++r) x += input(r, i);
        want[i] = x;
        lane[i % kSquareLanes] += static_cast<double>(x) * x;
        big = std::max(big, std::fabs(x));
      }
      double sum = 0;
      for (double l : lane) sum += l;
      for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
        if (!SimdLevelSupported(level)) continue;
        std::vector<std::vector<float>> buf(nparts + 1, std::vector<float>(n));
        for (int r = 0; r <= nparts; ++r) {
          for (size_t i = 0; i < n; ++i) buf[r][i] = input(r, i);
        }
        std::vector<float*> parts;
        for (int r = 1; r <= nparts; ++r) parts.push_back(buf[r].data());
        const BlockSquares q = FoldSquares(level, buf[0].data(), parts.data(), nparts, n);
        const std::string where = std::string(SimdLevelName(level)) + " parts " +
                                  std::to_string(nparts) + " n " + std::to_string(n);
        EXPECT_EQ(q.sum, sum) << where;
        EXPECT_EQ(q.largest, big) << where;
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(buf[0][i], want[i]) << where << " element " << i;
          for (int r = 1; r <= nparts; ++r) ASSERT_EQ(buf[r][i], input(r, i)) << where;
        }
        // The close path's fold alone (FoldParts): the same totals, the
        // parts as they were.
        for (int r = 0; r <= nparts; ++r) {
          for (size_t i = 0; i < n; ++i) buf[r][i] = input(r, i);
        }
        FoldParts(level, buf[0].data(), parts.data(), nparts, n);
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(buf[0][i], want[i]) << where << " FoldParts element " << i;
          for (int r = 1; r <= nparts; ++r) {
            ASSERT_EQ(buf[r][i], input(r, i)) << where << " FoldParts";
          }
        }
      }
    }
  }
}

// FoldNorm folds as Fold does: the same totals, the other ranks only read.
TEST(RoundAccumulatorTest, FoldNormFoldsAsFold) {
  RoundAccumulator a({{5, 9}}, 4, true), b({{5, 9}}, 4, true);
  for (int r = 0; r < 4; ++r) {
    for (int64_t c = 0; c < 9; ++c) {
      for (int64_t i = 0; i < 5; ++i) {
        const float x = 0.1f * static_cast<float>(r + 1) + 1e-4f * static_cast<float>(c * 5 + i);
        a.sum_of(0, r, 3, c)[i] = x;
        b.sum_of(0, r, 3, c)[i] = x;
      }
    }
  }
  a.Fold(SimdLevel::kScalar, 0, 3, 2, 4);
  const BlockSquares q = b.FoldNorm(BestSimdLevel(), 0, 3, 2, 4);
  double sum = 0;
  for (int r = 0; r < 4; ++r) {
    for (int64_t c = 0; c < 9; ++c) {
      for (int64_t i = 0; i < 5; ++i) {
        ASSERT_EQ(a.sum_of(0, r, 3, c)[i], b.sum_of(0, r, 3, c)[i]) << r << " " << c;
        if (r == 0 && c >= 2 && c < 6) sum += static_cast<double>(a.sum(0, 3, c)[i]) * a.sum(0, 3, c)[i];
      }
    }
  }
  EXPECT_NEAR(q.sum, sum, 1e-12 * sum);
}

// A world beyond the 64 parts a pass takes: every fold (the close path's
// FoldRanks, in pieces or at once, and the update's FoldNorm) adds each
// value's ranks in rank order, at every level: the bits of a sequential
// float sum, every other rank's part only read.
TEST(RoundAccumulatorTest, AWorldOfMoreThanSixtyFourRanksFoldsInRankOrder) {
  constexpr int kWorld = 70;
  constexpr int64_t kRows = 3, kCols = 11;
  auto value = [](int r, int64_t c, int64_t i) {
    return (r % 3 == 0 ? 1e6f : 1e-3f) * static_cast<float>((r * 13 + c * 7 + i) % 17) - 0.5f;
  };
  std::vector<float> want(kRows * kCols);
  for (int64_t c = 0; c < kCols; ++c) {
    for (int64_t i = 0; i < kRows; ++i) {
      float x = value(0, c, i);
      for (int r = 1; r < kWorld; ++r) x += value(r, c, i);
      want[c * kRows + i] = x;
    }
  }
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (!SimdLevelSupported(level)) continue;
    for (int how = 0; how < 3; ++how) {
      SCOPED_TRACE(std::string(SimdLevelName(level)) + " way " + std::to_string(how));
      RoundAccumulator acc({{kRows, kCols}}, kWorld, true);
      for (int r = 0; r < kWorld; ++r) {
        for (int64_t c = 0; c < kCols; ++c) {
          for (int64_t i = 0; i < kRows; ++i) acc.sum_of(0, r, 1, c)[i] = value(r, c, i);
        }
      }
      if (how == 0) {
        acc.FoldRanks(level, 1, 1, kWorld);
      } else if (how == 1) {
        acc.FoldRanks(level, 1, 1, 5);
        acc.FoldRanks(level, 1, 5, kWorld);
      } else {
        (void)acc.FoldNorm(level, 0, 1, 0, kCols);
      }
      for (int64_t k = 0; k < kRows * kCols; ++k) {
        ASSERT_EQ(acc.sum(0, 1, 0)[k], want[k]) << "value " << k;
        for (int r = 1; r < kWorld; ++r) {
          ASSERT_EQ(acc.sum_of(0, r, 1, 0)[k], value(r, k / kRows, k % kRows))  // only read
              << "rank " << r;
        }
      }
    }
  }
}

}  // namespace
}  // namespace zenflow
