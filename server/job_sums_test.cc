// The job's round sums in either form (JobSpec rank_ordered_sums): the
// state independent of the order shards and closes arrive in, and sums
// reused across rounds without zeroing (rank-ordered, one rank) equal to
// the shared sums, which are zeroed after every update.
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "server/job.h"
#include "server/job_test_support.h"
#include "server/registry.h"

namespace zenflow {
namespace {

// Sends the (rank, step) shards in `order`, then both ranks close `round`.
void PushTwoRanks(Job* job, int64_t round, const std::vector<std::pair<int, int64_t>>& order) {
  for (const auto& [rank, step] : order) {
    ASSERT_TRUE(job->HandleUp(rank, AllColumns(step, OrderSensitive(rank, step)), Wire::kGrpc).ok());
  }
  for (int rank : {0, 1}) ASSERT_TRUE(job->HandleUp(rank, Close(round, 2, 0.1), Wire::kGrpc).ok());
}

// Two ranks whose shards arrive in different orders: with rank_ordered_sums
// the state is bit-identical, including after a snapshot taken with rank
// 1's part of a round summed apart; without it the orders give different
// state (so the test sees the option at work).
TEST(JobTest, RankOrderedSumsMakeTheStateIndependentOfArrivalOrder) {
  const std::vector<std::pair<int, int64_t>> rank_major = {{0, 0}, {0, 1}, {1, 0}, {1, 1}};
  const std::vector<std::pair<int, int64_t>> rank1_first = {{1, 0}, {1, 1}, {0, 0}, {0, 1}};
  const std::vector<std::pair<int, int64_t>> round1 = {{0, 2}, {1, 2}, {0, 3}, {1, 3}};
  std::string shared[2], ordered[2];
  for (bool rank_ordered : {false, true}) {
    for (int i = 0; i < 2; ++i) {
      JobRegistry registry(RegistryOptions{});
      std::shared_ptr<Job> job = JoinedJob(&registry, 2, rank_ordered);
      PushTwoRanks(job.get(), 0, i == 0 ? rank_major : rank1_first);
      (rank_ordered ? ordered : shared)[i] = StateAfterUpdates(job.get());
    }
  }
  EXPECT_NE(shared[0], shared[1]) << "these orders should round differently in one buffer";
  EXPECT_EQ(ordered[0], ordered[1]);

  // Round 1 half-way through a snapshot, then the rest in another order.
  JobRegistry registry(RegistryOptions{});
  std::shared_ptr<Job> whole = JoinedJob(&registry, 2, true);
  PushTwoRanks(whole.get(), 0, rank_major);
  PushTwoRanks(whole.get(), 1, round1);
  const std::string want = StateAfterUpdates(whole.get());

  JobRegistry first(RegistryOptions{});
  std::shared_ptr<Job> job = JoinedJob(&first, 2, true);
  PushTwoRanks(job.get(), 0, rank1_first);
  for (const auto& [rank, step] : {std::make_pair(1, int64_t{2}), std::make_pair(0, int64_t{2})}) {
    ASSERT_TRUE(job->HandleUp(rank, AllColumns(step, OrderSensitive(rank, step)), Wire::kGrpc).ok());
  }
  absl::StatusOr<JobSnapshot> snap = job->Snapshot();
  ASSERT_TRUE(snap.ok()) << snap.status();
  std::map<std::string, const std::string*> sections = SectionsOf(*snap);
  ASSERT_EQ(sections.count("t0.sum0.r1"), 1u);
  ASSERT_EQ(sections.count("t0.sum1.r1"), 1u);
  JobRegistry second(RegistryOptions{});
  v1::JobSpec spec;
  ASSERT_TRUE(spec.ParseFromString(*sections.at("spec")));
  ASSERT_TRUE(second.CreateJob(spec).ok());
  std::shared_ptr<Job> copy = *second.Find("unit");
  std::map<std::string, const std::string*> missing = sections;
  missing.erase("t0.sum1.r1");
  absl::Status s = copy->LoadSnapshot(missing);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  ASSERT_TRUE(copy->LoadSnapshot(sections).ok());
  PushTwoRanks(copy.get(), 1, {{1, 3}, {0, 3}});
  EXPECT_EQ(StateAfterUpdates(copy.get()), want);
}

// Sums are not zeroed between rounds where each rank has a buffer of its own
// (rank-ordered sums, one rank): a rank's first add of a round into a column
// stores. Over four rounds (each parity's buffers reused twice), with shards
// that split the columns differently per step and per rank, and a job
// restored from a snapshot in the middle of round 2, the state equals the
// shared-sums job's, which zeroes its buffer after every update (the
// gradients are exact in fp32, so every order of adding gives the same
// bits); and one rank equals two ranks of shared sums sending the same.
TEST(JobTest, SumsReusedWithoutZeroingEqualZeroedSums) {
  auto grad = [](int rank, int64_t step, int32_t c, int row) {
    return 0.25f * static_cast<float>((step * 3 + c + row) % 5) - 0.5f * static_cast<float>(rank) +
           (c == 1 ? 8.0f : 0.0f);
  };
  auto shard = [&](int rank, int64_t step, const std::vector<int32_t>& cols, bool same) {
    v1::UpMessage m;
    auto* s = m.mutable_shard();
    s->set_step(step);
    s->set_tensor("w");
    s->set_dtype(v1::DTYPE_FP32);
    std::vector<float> g;
    for (int32_t c : cols) {
      s->add_columns(c);
      for (int row = 0; row < 2; ++row) g.push_back(grad(same ? 0 : rank, step, c, row));
    }
    s->set_payload(reinterpret_cast<const char*>(g.data()), sizeof(float) * g.size());
    return m;
  };
  // Rounds [from, to) of `world` ranks into *job (which may be replaced by
  // a copy restored from a snapshot taken after round 2's first shards).
  auto run = [&](std::shared_ptr<Job>* job, JobRegistry* spare, int world, bool same,
                 bool restore) {
    for (int64_t round = 0; round < 4; ++round) {
      for (int64_t step = 2 * round; step < 2 * round + 2; ++step) {
        for (int rank = 0; rank < world; ++rank) {
          const bool split = (step + rank) % 2 == 1;
          const std::vector<std::vector<int32_t>> parts =
              split ? std::vector<std::vector<int32_t>>{{2}, {0, 1}}
                    : std::vector<std::vector<int32_t>>{{0, 1, 2}};
          for (const auto& cols : parts) {
            ASSERT_TRUE((*job)->HandleUp(rank, shard(rank, step, cols, same), Wire::kGrpc).ok());
          }
        }
        if (restore && step == 4) {
          absl::StatusOr<JobSnapshot> snap = (*job)->Snapshot();
          ASSERT_TRUE(snap.ok()) << snap.status();
          std::shared_ptr<Job> copy = LoadedCopy(spare, SectionsOf(*snap));
          ASSERT_NE(copy, nullptr);
          *job = copy;
        }
      }
      for (int rank = 0; rank < world; ++rank) {
        ASSERT_TRUE((*job)->HandleUp(rank, Close(round, 2, 0.1), Wire::kGrpc).ok());
      }
      ASSERT_TRUE((*job)->Snapshot().ok());  // the update done: round + 2 may reuse its buffer
    }
  };
  auto state = [&](int world, bool rank_ordered, bool same, bool restore) {
    JobRegistry registry(RegistryOptions{}), spare(RegistryOptions{});
    std::shared_ptr<Job> job = JoinedJob(&registry, world, rank_ordered);
    run(&job, &spare, world, same, restore);
    return StateAfterUpdates(job.get());
  };
  const std::string shared = state(2, false, false, false);
  ASSERT_FALSE(shared.empty());
  EXPECT_EQ(state(2, true, false, false), shared) << "rank-ordered";
  EXPECT_EQ(state(2, true, false, true), shared) << "rank-ordered, restored in round 2";
  EXPECT_EQ(state(1, false, true, false), state(2, false, true, false)) << "one rank";
  EXPECT_EQ(state(1, false, true, true), state(2, false, true, false)) << "one rank, restored";
}

// Rank-ordered sums are folded as ranks close (rank r once ranks 0..r
// have): whatever order four ranks' shards and closes arrive in, and with
// a snapshot taken and restored between closes, the state after the
// update is the same bits.
TEST(JobTest, RankOrderedSumsFoldedAtClosesDoNotDependOnCloseOrder) {
  constexpr int kWorld = 4;
  auto value = [](int rank, int64_t step) {
    static constexpr float kV[kWorld][2] = {{1e8f, 1.0f}, {1.0f, -1e8f}, {3.0f, 1e8f}, {-1e8f, 5.0f}};
    const float v = kV[rank][step % 2];
    return std::array<float, 6>{v, v, v, v, v, v};
  };
  std::vector<int> order = {0, 1, 2, 3};
  std::string want;
  int runs = 0;
  do {
    JobRegistry registry(RegistryOptions{});
    std::shared_ptr<Job> job = JoinedJob(&registry, kWorld, true);
    // Shards: the close order's last rank first, then the others.
    for (int i = kWorld - 1; i >= 0; --i) {
      for (int64_t step : {0, 1}) {
        ASSERT_TRUE(job->HandleUp(order[i], AllColumns(step, value(order[i], step)), Wire::kGrpc).ok());
      }
    }
    const bool restore = runs % 5 == 0;
    JobRegistry second(RegistryOptions{});
    for (int i = 0; i < kWorld; ++i) {
      ASSERT_TRUE(job->HandleUp(order[i], Close(0, 2, 0.1), Wire::kGrpc).ok());
      if (restore && i == 1) {
        absl::StatusOr<JobSnapshot> snap = job->Snapshot();
        ASSERT_TRUE(snap.ok()) << snap.status();
        job = LoadedCopy(&second, SectionsOf(*snap));
        ASSERT_NE(job, nullptr);
      }
    }
    const std::string got = StateAfterUpdates(job.get());
    if (runs == 0) want = got;
    EXPECT_EQ(got, want) << "close order " << order[0] << order[1] << order[2] << order[3];
    ++runs;
  } while (std::next_permutation(order.begin(), order.end()));
  EXPECT_EQ(runs, 24);
  // Rank order, not arrival order: one shared buffer of the first
  // arrival order would round differently.
  JobRegistry registry(RegistryOptions{});
  std::shared_ptr<Job> shared = JoinedJob(&registry, kWorld, false);
  for (int rank : {3, 2, 1, 0}) {
    for (int64_t step : {0, 1}) {
      ASSERT_TRUE(shared->HandleUp(rank, AllColumns(step, value(rank, step)), Wire::kGrpc).ok());
    }
  }
  for (int rank = 0; rank < kWorld; ++rank) {
    ASSERT_TRUE(shared->HandleUp(rank, Close(0, 2, 0.1), Wire::kGrpc).ok());
  }
  EXPECT_NE(StateAfterUpdates(shared.get()), want);
}

}  // namespace
}  // namespace zenflow
