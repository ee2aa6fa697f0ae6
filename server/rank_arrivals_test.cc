#include "server/rank_arrivals.h"

#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"

namespace zenflow {
namespace {

TEST(RankArrivalsTest, ColumnsOfAStepMergeIntoRunsAcrossImportantGaps) {
  RankArrivals arr({6, 4}, /*world=*/2);
  arr.SetImportant(0, {0, 0, 1, 0, 1, 0});  // tensor 0: columns 0, 1, 3, 5 remote
  for (int32_t c : {0, 1, 3, 5}) {
    EXPECT_FALSE(arr.Received(0, 1, 7, c));
    arr.MarkReceived(0, 1, 7, c);
    EXPECT_TRUE(arr.Received(0, 1, 7, c));
  }
  EXPECT_FALSE(arr.Received(0, 1, 8, 0)) << "another step";
  EXPECT_FALSE(arr.Received(0, 0, 7, 0)) << "another rank";
  EXPECT_FALSE(arr.Received(0, 1, 7, 2)) << "an important column is never received";
  for (int32_t c = 0; c < 4; ++c) arr.MarkReceived(1, 1, 7, c);
  // Every daemon column of step 7 from rank 1: one run, whatever the gaps.
  EXPECT_EQ(arr.Save().size(), 8u * (1 + 1 + (1 + 1 + 1 + 2)));  // world, 2 ranks, 1 run
  RankArrivals::Miss miss;
  EXPECT_FALSE(arr.FirstIncomplete(1, 1, &miss));
  EXPECT_TRUE(arr.FirstIncomplete(1, 2, &miss));
  EXPECT_EQ(miss.tensor, 0);
  EXPECT_EQ(miss.column, 0);
  EXPECT_EQ(miss.hits, 1);
  EXPECT_TRUE(arr.FirstIncomplete(0, 1, &miss)) << "rank 0 sent nothing";
  EXPECT_EQ(miss.column, 0);
  EXPECT_EQ(miss.hits, 0);
  EXPECT_TRUE(arr.Seen(1, 1, 3));
  EXPECT_FALSE(arr.Seen(1, 0, 3)) << "rank 0 sent nothing";
  EXPECT_FALSE(arr.Seen(0, 1, 2)) << "an important column is never seen";
  arr.ResetRank(1);
  EXPECT_FALSE(arr.Received(0, 1, 7, 0));
  EXPECT_EQ(arr.hits(1, 1, 3), 0);
  EXPECT_FALSE(arr.Seen(1, 1, 3));
}

// Seen answers whether a column came in any step of the open round, where
// only a later step has it too (a column that became the daemon's mid-round).
TEST(RankArrivalsTest, SeenFindsAColumnInAnyStepOfTheRound) {
  RankArrivals arr({6}, 1);
  for (int64_t step = 0; step < 50; ++step) {
    for (int32_t c = 0; c < 4; ++c) arr.MarkReceived(0, 0, step, c);
  }
  arr.MarkReceived(0, 0, 49, 5);
  for (int32_t c = 0; c < 4; ++c) EXPECT_TRUE(arr.Seen(0, 0, c)) << c;
  EXPECT_FALSE(arr.Seen(0, 0, 4));
  EXPECT_TRUE(arr.Seen(0, 0, 5)) << "only the newest step has it";
  EXPECT_EQ(arr.hits(0, 0, 5), 1);
  EXPECT_EQ(arr.hits(0, 0, 0), 50);
}

TEST(RankArrivalsTest, FirstIncompleteNamesTheFirstColumnShortOfSteps) {
  RankArrivals arr({5, 5}, 1);
  for (int64_t step : {10, 11}) {
    for (int t = 0; t < 2; ++t) {
      for (int32_t c = 0; c < 5; ++c) {
        if (!(step == 11 && t == 1 && c == 3)) arr.MarkReceived(t, 0, step, c);
      }
    }
  }
  RankArrivals::Miss miss;
  ASSERT_TRUE(arr.FirstIncomplete(0, 2, &miss));
  EXPECT_EQ(miss.tensor, 1);
  EXPECT_EQ(miss.column, 3);
  EXPECT_EQ(miss.hits, 1);
  arr.MarkReceived(1, 0, 11, 3);
  EXPECT_FALSE(arr.FirstIncomplete(0, 2, &miss));
  ASSERT_TRUE(arr.FirstIncomplete(0, 3, &miss));
  EXPECT_EQ(miss.tensor, 0);
  EXPECT_EQ(miss.column, 0);
  EXPECT_EQ(miss.hits, 2);
}

// Against a plain set of (rank, step, tensor, column): columns of a few
// steps marked in a random order, with a reselection part way.
TEST(RankArrivalsTest, AgreesWithASetOfEveryArrival) {
  std::mt19937 rng(7);
  const std::vector<int64_t> cols = {13, 1, 29};
  RankArrivals arr(cols, 3);
  std::vector<std::vector<uint8_t>> important(cols.size());
  for (size_t t = 0; t < cols.size(); ++t) important[t].assign(cols[t], 0);
  std::set<std::tuple<int, int64_t, int, int32_t>> ref;
  for (int i = 0; i < 3000; ++i) {
    if (i == 1500) {
      for (size_t t = 0; t < cols.size(); ++t) {
        for (auto& x : important[t]) x = rng() % 4 == 0 ? 1 : 0;
        arr.SetImportant(static_cast<int>(t), important[t]);
      }
      for (auto it = ref.begin(); it != ref.end();) {
        it = important[std::get<2>(*it)][std::get<3>(*it)] ? ref.erase(it) : std::next(it);
      }
    }
    const int rank = static_cast<int>(rng() % 3);
    const int64_t step = 100 + static_cast<int64_t>(rng() % 3);
    const int t = static_cast<int>(rng() % cols.size());
    const int32_t c = static_cast<int32_t>(rng() % cols[t]);
    const bool want = ref.count({rank, step, t, c}) > 0;
    ASSERT_EQ(arr.Received(t, rank, step, c), want) << i;
    if (!want && !important[t][c]) {
      arr.MarkReceived(t, rank, step, c);
      ref.insert({rank, step, t, c});
    }
    if (i % 97 == 0) {
      for (int r = 0; r < 3; ++r) {
        for (int64_t steps : {1, 2, 3}) {
          // The reference's first column (tensor, column order) short of steps.
          bool want_miss = false;
          RankArrivals::Miss w;
          for (int tt = 0; tt < static_cast<int>(cols.size()) && !want_miss; ++tt) {
            for (int32_t cc = 0; cc < cols[tt] && !want_miss; ++cc) {
              if (important[tt][cc]) continue;
              int32_t h = 0;
              for (int64_t s = 100; s < 103; ++s) h += ref.count({r, s, tt, cc}) > 0 ? 1 : 0;
              EXPECT_EQ(arr.hits(tt, r, cc), h);
              EXPECT_EQ(arr.Seen(tt, r, cc), h > 0) << tt << " " << r << " " << cc;
              if (h != steps) {
                want_miss = true;
                w = {tt, cc, h};
              }
            }
          }
          RankArrivals::Miss got;
          ASSERT_EQ(arr.FirstIncomplete(r, steps, &got), want_miss) << i;
          if (want_miss) {
            EXPECT_EQ(got.tensor, w.tensor);
            EXPECT_EQ(got.column, w.column);
            EXPECT_EQ(got.hits, w.hits);
          }
        }
      }
    }
  }
  RankArrivals copy(cols, 3);
  for (size_t t = 0; t < cols.size(); ++t) copy.SetImportant(static_cast<int>(t), important[t]);
  ASSERT_TRUE(copy.Load(arr.Save()).ok());
  for (const auto& [rank, step, t, c] : ref) EXPECT_TRUE(copy.Received(t, rank, step, c));
  EXPECT_EQ(copy.Save(), arr.Save());
}

TEST(RankArrivalsTest, LoadRejectsWhatSaveDoesNotWrite) {
  RankArrivals arr({8}, 2);
  for (int32_t c = 0; c < 8; c += 2) arr.MarkReceived(0, 1, 3, c);
  const std::string good = arr.Save();
  RankArrivals other({8}, 2);
  ASSERT_TRUE(other.Load(good).ok());
  EXPECT_FALSE(other.Load(good.substr(0, good.size() - 1)).ok()) << "truncated";
  EXPECT_FALSE(other.Load(good + std::string(8, '\0')).ok()) << "trailing";
  RankArrivals wrong_world({8}, 3);
  EXPECT_FALSE(wrong_world.Load(good).ok());
  RankArrivals fewer_cols({6}, 2);
  EXPECT_FALSE(fewer_cols.Load(good).ok()) << "a run past the columns";
  // A failed load leaves what was there.
  EXPECT_TRUE(other.Received(0, 1, 3, 6));
}

TEST(RankArrivalsTest, PerColumnCheckpointsLoadAsTheirSteps) {
  RankArrivals arr({4}, 1);
  const int64_t last[4] = {5, 5, 4, -1};
  const int32_t hits[4] = {2, 1, 1, 0};
  arr.LoadPerColumn(0, 0, last, hits);
  EXPECT_TRUE(arr.Received(0, 0, 4, 0));
  EXPECT_TRUE(arr.Received(0, 0, 5, 0));
  EXPECT_TRUE(arr.Received(0, 0, 5, 1));
  EXPECT_FALSE(arr.Received(0, 0, 4, 1));
  EXPECT_TRUE(arr.Received(0, 0, 4, 2));
  EXPECT_EQ(arr.hits(0, 0, 3), 0);
}

// Issue 32: 4096 ranks x 32,768 columns, every rank's every column of a
// step received: kilobytes per rank, not bytes per rank and column.
TEST(RankArrivalsTest, AWorldOf4096HoldsRunsNotRanksTimesColumns) {
  constexpr int kWorld = 4096;
  constexpr int32_t kCols = 32768;
  RankArrivals arr({kCols}, kWorld);
  for (int r = 0; r < kWorld; ++r) {
    for (int32_t c = 0; c < kCols; ++c) arr.MarkReceived(0, r, 0, c);
  }
  RankArrivals::Miss miss;
  EXPECT_FALSE(arr.FirstIncomplete(kWorld - 1, 1, &miss));
  EXPECT_LT(arr.bytes(), int64_t{1} << 20);
  EXPECT_LE(arr.bytes(), kCols * RankArrivals::kBytesPerColumn + 64 +
                             kWorld * (RankArrivals::kBytesPerRank + RankArrivals::kBytesPerStep));
}

}  // namespace
}  // namespace zenflow
