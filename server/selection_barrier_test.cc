#include "server/selection_barrier.h"

#include <vector>

#include "gtest/gtest.h"

namespace zenflow {
namespace {

struct Calls {
  std::vector<absl::Status> results;
  SelectionBarrier::Done Fn() {
    return [this](absl::StatusOr<v1::Selection> r) { results.push_back(r.status()); };
  }
};

TEST(SelectionBarrierTest, ScoresSumInRankOrderAndTakeEndsTheRendezvous) {
  SelectionBarrier b(3);
  Calls calls;
  EXPECT_EQ(b.step(), -1);
  EXPECT_EQ(b.Submit(2, 8, {{1.0f, 2.0f}, {}}, 1, calls.Fn()), nullptr);
  EXPECT_EQ(b.step(), 8);
  EXPECT_FALSE(b.all_submitted());
  EXPECT_EQ(b.Submit(0, 8, {{0.5f, 0.25f}, {}}, 2, calls.Fn()), nullptr);
  EXPECT_EQ(b.Submit(1, 8, {{0.125f, 4.0f}, {}}, 3, calls.Fn()), nullptr);
  EXPECT_TRUE(b.all_submitted());
  EXPECT_EQ(b.bytes(), 3 * 2 * 4);
  EXPECT_EQ(b.SummedScores(0, 2), (std::vector<float>{(0.5f + 0.125f) + 1.0f, (0.25f + 4.0f) + 2.0f}));
  EXPECT_EQ(b.SummedScores(1, 3), (std::vector<float>{0, 0, 0})) << "a tensor no rank scored";
  std::vector<SelectionBarrier::Done> waiters = b.Take();
  EXPECT_EQ(waiters.size(), 3u);
  EXPECT_EQ(b.step(), -1);
  EXPECT_EQ(b.bytes(), 0);
}

TEST(SelectionBarrierTest, ARetryReplacesAndAWithdrawnCallLeavesNothing) {
  SelectionBarrier b(2);
  Calls first, second;
  EXPECT_EQ(b.Submit(0, 4, {{9.0f}}, 1, first.Fn()), nullptr);
  SelectionBarrier::Done replaced = b.Submit(0, 4, {{1.0f}}, 2, second.Fn());
  ASSERT_NE(replaced, nullptr) << "the earlier call is handed back to be answered";
  replaced(absl::AbortedError("replaced"));
  EXPECT_EQ(first.results.size(), 1u);
  EXPECT_EQ(b.bytes(), 4);
  EXPECT_EQ(b.SummedScores(0, 1), std::vector<float>{1.0f}) << "only the retry's scores count";
  b.Withdraw(0, /*call=*/1);  // the replaced call's cancellation: a no-op
  EXPECT_TRUE(b.submitted(0));
  b.Withdraw(0, 2);
  EXPECT_FALSE(b.submitted(0));
  EXPECT_EQ(b.step(), -1) << "nobody waits: the step is forgotten";
  EXPECT_EQ(b.bytes(), 0);
  // Another step may be gathered now.
  EXPECT_EQ(b.Submit(1, 12, {{2.0f}}, 3, second.Fn()), nullptr);
  EXPECT_EQ(b.step(), 12);
}

}  // namespace
}  // namespace zenflow
