// LocalReducer: the rank-order mean the daemon's AllReduce computes, the
// rendezvous alone without arithmetic, and its refusals.
#include "gpu_worker/engine/local_reducer.h"

#include <cstring>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace zenflow {
namespace {

// Values whose float sum depends on the order they are added in.
float Value(int rank, int part, int j) {
  const float big[3] = {1e8f, 1.0f, -1e8f};
  return big[rank % 3] + 0.25f * static_cast<float>(j + part) + 0.5f * static_cast<float>(rank);
}

TEST(LocalReducerTest, ThreeRanksGetTheRankOrderMeanOverSeveralSteps) {
  constexpr int kWorld = 3, kN = 37;
  LocalReducer group(kWorld);
  std::vector<std::vector<std::vector<float>>> data(
      kWorld, std::vector<std::vector<float>>(2, std::vector<float>(kN)));
  std::vector<absl::Status> status(kWorld);
  for (int step = 0; step < 4; ++step) {
    for (int r = 0; r < kWorld; ++r) {
      for (int p = 0; p < 2; ++p) {
        for (int j = 0; j < kN; ++j) data[r][p][j] = Value(r, p + step, j);
      }
    }
    std::vector<std::thread> threads;
    for (int r = 0; r < kWorld; ++r) {
      threads.emplace_back([&, r] {
        GradientReducer reduce = group.ForRank(r);
        std::vector<ReducePart> parts = {{"a", data[r][0].data(), kN}, {"b", data[r][1].data(), kN}};
        status[r] = reduce(step, parts);
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < kWorld; ++r) ASSERT_TRUE(status[r].ok()) << status[r];
    for (int p = 0; p < 2; ++p) {
      for (int j = 0; j < kN; ++j) {
        float want = 0.0f;
        for (int r = 0; r < kWorld; ++r) want += Value(r, p + step, j);
        want *= 1.0f / kWorld;
        for (int r = 0; r < kWorld; ++r) {
          ASSERT_EQ(std::memcmp(&data[r][p][j], &want, 4), 0)
              << "step " << step << " rank " << r << " part " << p << " element " << j;
        }
      }
    }
  }
}

TEST(LocalReducerTest, WithoutArithmeticItIsARendezvousThatLeavesTheValues) {
  LocalReducer group(2, LocalReducer::Arithmetic::kNone);
  std::vector<float> a = {1, 2}, b = {3, 4};
  absl::Status sa, sb;
  std::thread t([&] { sa = group.ForRank(0)(0, {{"w", a.data(), 2}}); });
  sb = group.ForRank(1)(0, {{"w", b.data(), 2}});
  t.join();
  EXPECT_TRUE(sa.ok() && sb.ok()) << sa << " " << sb;
  EXPECT_EQ(a, (std::vector<float>{1, 2}));
  EXPECT_EQ(b, (std::vector<float>{3, 4}));
}

TEST(LocalReducerTest, DifferentPartsOrStepsOrAMissingRankFail) {
  {
    LocalReducer group(2);
    std::vector<float> a(4), b(3);
    absl::Status sa, sb;
    std::thread t([&] { sa = group.ForRank(0)(0, {{"w", a.data(), 4}}); });
    sb = group.ForRank(1)(0, {{"w", b.data(), 3}});
    t.join();
    EXPECT_EQ(sa.code(), absl::StatusCode::kInvalidArgument) << sa;
    EXPECT_EQ(sb.code(), absl::StatusCode::kInvalidArgument) << sb;
  }
  {
    LocalReducer group(2);
    std::vector<float> a(2), b(2);
    absl::Status sa, sb;
    std::thread t([&] { sa = group.ForRank(0)(5, {{"w", a.data(), 2}}); });
    // Rank 1 may come first or second: either way both learn of the mismatch.
    sb = group.ForRank(1)(6, {{"w", b.data(), 2}});
    t.join();
    EXPECT_EQ(sb.code(), absl::StatusCode::kInvalidArgument) << sb;
    EXPECT_FALSE(sa.ok());
  }
  {
    LocalReducer group(2, LocalReducer::Arithmetic::kMean, absl::Milliseconds(50));
    std::vector<float> a(2);
    absl::Status s = group.ForRank(0)(0, {{"w", a.data(), 2}});
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_NE(s.message().find("rank(s) 1"), absl::string_view::npos) << s;
    // Broken for good: a later call fails at once.
    EXPECT_EQ(group.ForRank(1)(0, {{"w", a.data(), 2}}).code(),
              absl::StatusCode::kDeadlineExceeded);
  }
  LocalReducer group(1);
  std::vector<float> a(1);
  EXPECT_EQ(group.ForRank(1)(0, {{"w", a.data(), 1}}).code(), absl::StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace zenflow
