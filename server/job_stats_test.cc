// Unit tests of a job's statistics: what they count and what GetStats gets.
#include "server/job_stats.h"

#include "gtest/gtest.h"

namespace zenflow {
namespace {

TEST(JobStatisticsTest, CountsShardsByTransport) {
  JobStatistics stats;
  stats.CountShard(Wire::kGrpc, 100);
  stats.CountShard(Wire::kUcx, 40);
  stats.CountShard(Wire::kGrpc, 1);
  EXPECT_EQ(stats.shards_received, 3);
  EXPECT_EQ(stats.shard_bytes_received, 141);
  EXPECT_EQ(stats.received[static_cast<int>(Wire::kGrpc)].shards, 2);
  EXPECT_EQ(stats.received[static_cast<int>(Wire::kGrpc)].bytes, 101);
  EXPECT_EQ(stats.received[static_cast<int>(Wire::kUcx)].shards, 1);
  EXPECT_EQ(stats.received[static_cast<int>(Wire::kUcx)].bytes, 40);
}

TEST(JobStatisticsTest, ExportsEveryCounter) {
  JobStatistics stats;
  stats.CountShard(Wire::kGrpc, 8);
  stats.rounds_skipped = 2;
  stats.rounds_overflowed = 1;
  stats.last_round_steps = 4;
  stats.delta_messages_sent = 6;
  stats.delta_bytes_sent = 60;
  stats.update_seconds_total = 1.5;
  stats.last_update_seconds = 0.5;
  stats.replays_dropped = 3;
  stats.update_seconds.Observe(0.5);
  stats.accumulate_seconds.Observe(0.25);
  v1::JobStats out;
  stats.Export(&out);
  EXPECT_EQ(out.shards_received(), 1);
  EXPECT_EQ(out.shard_bytes_received(), 8);
  EXPECT_EQ(out.rounds_skipped_nonfinite(), 2);
  EXPECT_EQ(out.rounds_overflowed(), 1);
  EXPECT_EQ(out.last_round_steps(), 4);
  EXPECT_EQ(out.delta_messages_sent(), 6);
  EXPECT_EQ(out.delta_bytes_sent(), 60);
  EXPECT_DOUBLE_EQ(out.update_seconds_total(), 1.5);
  EXPECT_DOUBLE_EQ(out.last_update_seconds(), 0.5);
  EXPECT_EQ(out.replays_dropped(), 3);
  EXPECT_TRUE(out.has_round_update_seconds());
  EXPECT_TRUE(out.has_round_accumulate_seconds());
}

TEST(RejectionCounterTest, ExportsTheCodesSeenByName) {
  RejectionCounter rejected;
  rejected.Add(absl::StatusCode::kInvalidArgument);
  rejected.Add(absl::StatusCode::kInvalidArgument);
  rejected.Add(absl::StatusCode::kNotFound);
  v1::JobStats out;
  rejected.Export(out.mutable_rejected());
  EXPECT_EQ(out.rejected().size(), 2u);
  EXPECT_EQ(out.rejected().at("INVALID_ARGUMENT"), 2);
  EXPECT_EQ(out.rejected().at("NOT_FOUND"), 1);
}

}  // namespace
}  // namespace zenflow
