// The all-reduce rendezvous without a network: means in rank order,
// rejections that leave nothing behind, retries, withdrawals, shutdown.
#include "server/all_reduce_barrier.h"

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace zenflow {
namespace {

v1::AllReduceRequest Request(int32_t rank, int64_t step, std::vector<float> values,
                             const std::string& name = "loss") {
  v1::AllReduceRequest req;
  req.set_rank(rank);
  req.set_step(step);
  v1::ReducePart* p = req.add_parts();
  p->set_name(name);
  p->set_payload(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  return req;
}

std::vector<float> Values(const v1::AllReduceResponse& r, int part = 0) {
  std::vector<float> out(r.parts(part).payload().size() / sizeof(float));
  std::memcpy(out.data(), r.parts(part).payload().data(), out.size() * sizeof(float));
  return out;
}

// Records what a call's callback got.
struct Result {
  std::optional<absl::StatusOr<v1::AllReduceResponse>> got;
  AllReduceBarrier::Done Callback() {
    return [this](absl::StatusOr<v1::AllReduceResponse> r) { got = std::move(r); };
  }
};

TEST(AllReduceBarrierTest, EveryRankGetsTheSameMeanSummedInRankOrder) {
  AllReduceBarrier b(3);
  Result r0, r1, r2;
  // Arrival order 2, 0, 1; the sum is still ((x0 + x1) + x2) / 3.
  const std::vector<float> x0 = {1e8f, 1.f}, x1 = {-1e8f, 2.f}, x2 = {1.f, 3.f};
  ASSERT_TRUE(b.Submit(Request(2, 5, x2), 12, r2.Callback()).ok());
  ASSERT_TRUE(b.Submit(Request(0, 5, x0), 10, r0.Callback()).ok());
  EXPECT_FALSE(r0.got.has_value());
  EXPECT_GT(b.bytes(), 0);
  ASSERT_TRUE(b.Submit(Request(1, 5, x1), 11, r1.Callback()).ok());
  for (Result* r : {&r0, &r1, &r2}) {
    ASSERT_TRUE(r->got.has_value());
    ASSERT_TRUE(r->got->ok()) << r->got->status();
    std::vector<float> want(2);
    for (int i = 0; i < 2; ++i) want[i] = ((x0[i] + x1[i]) + x2[i]) * (1.0f / 3.0f);
    EXPECT_EQ(Values(**r->got), want);
    EXPECT_EQ((*r->got)->parts(0).name(), "loss");
  }
  EXPECT_EQ(b.bytes(), 0);
}

TEST(AllReduceBarrierTest, RejectionsRecordNothing) {
  AllReduceBarrier b(2);
  Result r;
  EXPECT_EQ(b.Submit(Request(0, -1, {1.f}), 1, r.Callback()).code(),
            absl::StatusCode::kInvalidArgument);
  v1::AllReduceRequest odd = Request(0, 1, {1.f});
  odd.mutable_parts(0)->mutable_payload()->push_back('x');
  EXPECT_EQ(b.Submit(odd, 1, r.Callback()).code(), absl::StatusCode::kInvalidArgument);
  absl::Status nan = b.Submit(Request(0, 1, {1.f, std::nanf("")}), 1, r.Callback());
  EXPECT_EQ(nan.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(nan.message().find("non-finite value at 1"), absl::string_view::npos) << nan;
  EXPECT_EQ(b.bytes(), 0);
  // Rank 0 waits on step 1: rank 1 must match its parts; rank 0 may not
  // start another step meanwhile.
  ASSERT_TRUE(b.Submit(Request(0, 1, {1.f, 2.f}), 1, r.Callback()).ok());
  const int64_t held = b.bytes();
  Result r1;
  absl::Status differs = b.Submit(Request(1, 1, {1.f}), 2, r1.Callback());
  EXPECT_EQ(differs.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(differs.message().find("differ in names or sizes from rank 0"), absl::string_view::npos)
      << differs;
  EXPECT_EQ(b.Submit(Request(1, 1, {1.f, 2.f}, "other"), 2, r1.Callback()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b.Submit(Request(0, 2, {1.f, 2.f}), 3, r.Callback()).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(b.bytes(), held);
  EXPECT_FALSE(r.got.has_value());
  EXPECT_FALSE(r1.got.has_value());
  // The next good call completes exactly.
  ASSERT_TRUE(b.Submit(Request(1, 1, {3.f, 4.f}), 2, r1.Callback()).ok());
  ASSERT_TRUE(r.got.has_value() && r.got->ok());
  EXPECT_EQ(Values(**r.got), (std::vector<float>{2.f, 3.f}));
}

TEST(AllReduceBarrierTest, ARetryReplacesTheEarlierCall) {
  AllReduceBarrier b(2);
  Result first, second, other;
  ASSERT_TRUE(b.Submit(Request(0, 1, {1.f}), 1, first.Callback()).ok());
  ASSERT_TRUE(b.Submit(Request(0, 1, {5.f}), 2, second.Callback()).ok());
  ASSERT_TRUE(first.got.has_value());
  EXPECT_EQ(first.got->status().code(), absl::StatusCode::kAborted);
  ASSERT_TRUE(b.Submit(Request(1, 1, {7.f}), 3, other.Callback()).ok());
  ASSERT_TRUE(second.got.has_value() && second.got->ok());
  EXPECT_EQ(Values(**second.got), (std::vector<float>{6.f}));
}

TEST(AllReduceBarrierTest, AWithdrawnCallLeavesNothingBehind) {
  AllReduceBarrier b(2);
  Result gone, r0, r1;
  ASSERT_TRUE(b.Submit(Request(0, 1, {100.f}), 1, gone.Callback()).ok());
  b.Withdraw(0, /*call=*/99);  // not its call: no-op
  EXPECT_GT(b.bytes(), 0);
  b.Withdraw(0, 1);
  EXPECT_EQ(b.bytes(), 0);
  // The rank may now take part in another step; the withdrawn values are gone.
  ASSERT_TRUE(b.Submit(Request(0, 2, {1.f}), 2, r0.Callback()).ok());
  ASSERT_TRUE(b.Submit(Request(1, 2, {3.f}), 3, r1.Callback()).ok());
  EXPECT_FALSE(gone.got.has_value());
  ASSERT_TRUE(r0.got.has_value() && r0.got->ok());
  EXPECT_EQ(Values(**r0.got), (std::vector<float>{2.f}));
}

TEST(AllReduceBarrierTest, ShutdownFailsWaitersAndLaterCalls) {
  AllReduceBarrier b(2);
  Result waiting, late;
  ASSERT_TRUE(b.Submit(Request(0, 1, {1.f}), 1, waiting.Callback()).ok());
  b.Shutdown(absl::NotFoundError("job 'j' was deleted"));
  ASSERT_TRUE(waiting.got.has_value());
  EXPECT_EQ(waiting.got->status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(b.Submit(Request(1, 1, {1.f}), 2, late.Callback()).code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(late.got.has_value());
  EXPECT_EQ(b.bytes(), 0);
}

v1::AllReduceRequest Replay(int32_t rank, int64_t step, std::vector<float> values) {
  v1::AllReduceRequest req = Request(rank, step, std::move(values));
  req.set_replay(true);
  return req;
}

TEST(AllReduceBarrierReplayTest, AReplayedPartAnswersARankThatLostItsAnswer) {
  // Rank 0 had step 5's mean when the daemon restarted; rank 1 had not. Rank
  // 0 replays its part and is answered at once; rank 1's retry completes.
  AllReduceBarrier b(2);
  Result replay, r1;
  ASSERT_TRUE(b.Submit(Replay(0, 5, {2.f, 4.f}), 1, replay.Callback()).ok());
  ASSERT_TRUE(replay.got.has_value());
  ASSERT_TRUE(replay.got->ok());
  EXPECT_EQ((*replay.got)->parts_size(), 0);
  EXPECT_GT(b.bytes(), 0);
  ASSERT_TRUE(b.Submit(Request(1, 5, {4.f, 8.f}), 2, r1.Callback()).ok());
  ASSERT_TRUE(r1.got.has_value() && r1.got->ok());
  EXPECT_EQ(Values(**r1.got), (std::vector<float>{3.f, 6.f}));
  EXPECT_EQ(b.bytes(), 0);
}

TEST(AllReduceBarrierReplayTest, ReplaysOfAStepEveryoneHadCompleteWithNobodyWaiting) {
  AllReduceBarrier b(2);
  Result a, c;
  ASSERT_TRUE(b.Submit(Replay(0, 5, {1.f}), 1, a.Callback()).ok());
  ASSERT_TRUE(b.Submit(Replay(1, 5, {3.f}), 2, c.Callback()).ok());
  EXPECT_TRUE(a.got.has_value() && c.got.has_value());
  EXPECT_EQ(b.bytes(), 0);
  // The next step is an ordinary rendezvous.
  Result r0, r1;
  ASSERT_TRUE(b.Submit(Request(0, 6, {1.f}), 3, r0.Callback()).ok());
  ASSERT_TRUE(b.Submit(Request(1, 6, {5.f}), 4, r1.Callback()).ok());
  ASSERT_TRUE(r0.got.has_value() && r0.got->ok());
  EXPECT_EQ(Values(**r0.got), (std::vector<float>{3.f}));
}

TEST(AllReduceBarrierReplayTest, AReplayNobodyNeedsGoesWhenALaterStepCompletes) {
  AllReduceBarrier b(2);
  Result a;
  ASSERT_TRUE(b.Submit(Replay(0, 5, {1.f, 1.f}), 1, a.Callback()).ok());
  const int64_t one = b.bytes();
  // A second replay of the rank replaces its first: one part held.
  ASSERT_TRUE(b.Submit(Replay(0, 6, {1.f, 1.f}), 2, a.Callback()).ok());
  EXPECT_EQ(b.bytes(), one);
  // The rank may call another step for real while its replay is held.
  Result r0, r1;
  ASSERT_TRUE(b.Submit(Request(0, 7, {1.f, 2.f}), 3, r0.Callback()).ok());
  ASSERT_TRUE(b.Submit(Request(1, 7, {3.f, 4.f}), 4, r1.Callback()).ok());
  ASSERT_TRUE(r1.got.has_value() && r1.got->ok());
  EXPECT_EQ(Values(**r1.got), (std::vector<float>{2.f, 3.f}));
  EXPECT_EQ(b.bytes(), 0);  // step 6's replayed part went with step 7
}

TEST(AllReduceBarrierReplayTest, AReplayWhileTheRanksOwnCallWaitsChangesNothing) {
  AllReduceBarrier b(2);
  Result r0, replay, r1;
  ASSERT_TRUE(b.Submit(Request(0, 5, {1.f}), 1, r0.Callback()).ok());
  ASSERT_TRUE(b.Submit(Replay(0, 5, {1.f}), 2, replay.Callback()).ok());
  EXPECT_TRUE(replay.got.has_value());
  EXPECT_FALSE(r0.got.has_value());
  ASSERT_TRUE(b.Submit(Request(1, 5, {3.f}), 3, r1.Callback()).ok());
  ASSERT_TRUE(r0.got.has_value() && r0.got->ok());
  EXPECT_EQ(Values(**r0.got), (std::vector<float>{2.f}));
}

TEST(AllReduceBarrierReplayTest, AReplayWithOtherShapesIsRejected) {
  AllReduceBarrier b(2);
  Result r0, bad;
  ASSERT_TRUE(b.Submit(Request(0, 5, {1.f, 2.f}), 1, r0.Callback()).ok());
  const absl::Status s = b.Submit(Replay(1, 5, {1.f}), 2, bad.Callback());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_FALSE(bad.got.has_value());
}

}  // namespace
}  // namespace zenflow
