// The replay log: order, forgetting durable rounds, the byte limit.
#include "client/replay_log.h"

#include <string>

#include "gtest/gtest.h"

namespace zenflow {
namespace {

v1::UpMessage Shard(int64_t step, int bytes) {
  v1::UpMessage m;
  m.mutable_shard()->set_step(step);
  m.mutable_shard()->set_payload(std::string(bytes, 'x'));
  return m;
}

v1::UpMessage Close(int64_t round) {
  v1::UpMessage m;
  m.mutable_close()->set_round(round);
  return m;
}

TEST(ReplayLogTest, KeepsEverythingInOrderMarkedAsReplays) {
  ReplayLog log(1 << 20);
  log.AddUp(0, Shard(0, 10));
  log.AddUp(0, Close(0));
  v1::SubmitImportanceRequest sel;
  sel.set_step(4);
  log.AddSelection(1, sel);
  v1::HandOffRequest ho;
  ho.set_version(1);
  log.AddHandOff(1, ho);
  log.AddUp(1, Shard(4, 10));
  const auto e = log.Entries();
  ASSERT_EQ(e.size(), 5u);
  EXPECT_EQ(e[0]->kind, ReplayEntry::Kind::kUp);
  EXPECT_TRUE(e[0]->up.replay());
  EXPECT_TRUE(e[1]->up.has_close());
  EXPECT_EQ(e[2]->kind, ReplayEntry::Kind::kSelection);
  EXPECT_TRUE(e[2]->selection.replay());
  EXPECT_EQ(e[3]->kind, ReplayEntry::Kind::kHandOff);
  EXPECT_TRUE(e[3]->hand_off.replay());
  EXPECT_EQ(e[4]->up.shard().step(), 4);
  EXPECT_EQ(log.complete_from(), 0);
  EXPECT_FALSE(log.LastAllReduce().has_value());
}

TEST(ReplayLogTest, ForgetsDurableRoundsAndLateMessagesOfThem) {
  ReplayLog log(1 << 20);
  for (int r = 0; r < 4; ++r) {
    log.AddUp(r, Shard(r * 2, 100));
    log.AddUp(r, Close(r));
  }
  const int64_t before = log.stats().bytes;
  log.Forget(2);
  EXPECT_EQ(log.complete_from(), 2);
  auto e = log.Entries();
  ASSERT_EQ(e.size(), 4u);
  EXPECT_EQ(e[0]->round, 2);
  EXPECT_LT(log.stats().bytes, before);
  log.Forget(1);  // older news changes nothing
  EXPECT_EQ(log.Entries().size(), 4u);
  log.AddUp(1, Shard(3, 10));  // a round already durable: not kept
  EXPECT_EQ(log.Entries().size(), 4u);
  log.Forget(4);
  EXPECT_EQ(log.Entries().size(), 0u);
  EXPECT_EQ(log.stats().bytes, 0);
}

TEST(ReplayLogTest, OverTheLimitTheOldestGoAndCompletenessMovesOn) {
  ReplayLog log(1000);
  log.AddUp(0, Shard(0, 400));
  log.AddUp(0, Shard(1, 400));
  EXPECT_EQ(log.complete_from(), 0);
  log.AddUp(1, Shard(2, 400));  // 1200 > 1000: round 0's first shard goes
  EXPECT_EQ(log.complete_from(), 1);
  EXPECT_EQ(log.stats().dropped_for_space, 1);
  EXPECT_LE(log.stats().bytes, 1000);
  log.AddUp(1, Shard(3, 5000));  // alone over the limit: kept, the rest goes
  EXPECT_EQ(log.Entries().size(), 1u);
  EXPECT_EQ(log.complete_from(), 2);
}

TEST(ReplayLogTest, KeepsOnlyTheNewestAllReduce) {
  ReplayLog log(1 << 20);
  v1::AllReduceRequest a;
  a.set_step(5);
  a.add_parts()->set_payload(std::string(400, 'a'));
  log.SetAllReduce(a);
  const int64_t one = log.stats().bytes;
  a.set_step(6);
  log.SetAllReduce(a);
  EXPECT_EQ(log.stats().bytes, one);
  ASSERT_TRUE(log.LastAllReduce().has_value());
  EXPECT_EQ(log.LastAllReduce()->step(), 6);
  EXPECT_TRUE(log.LastAllReduce()->replay());
}

}  // namespace
}  // namespace zenflow
