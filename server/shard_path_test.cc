// The shard path's one pass (Job::AddShard with skip_nonfinite_rounds):
// a NaN in a late block stops the add after the blocks before it, and the
// skipped round leaves no trace: the job ends bit for bit where a job whose
// bad shard had its NaN first (nothing added) ends. And the default mode,
// which rejects such a shard: the sums stay bit for bit as they were and
// the good shard sent after it is exact. With and without rank-ordered
// sums, the payload in the message or in pieces.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/codec.h"
#include "common/up_wire.h"
#include "gtest/gtest.h"
#include "server/job.h"
#include "server/job_test_support.h"
#include "server/registry.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {
namespace {

constexpr int kWorld = 2;
constexpr int kRows = 64;
constexpr int kCols = 96;  // 6144 values a shard: three blocks of the fused add

std::shared_ptr<Job> MakeJob(JobRegistry* registry, bool rank_ordered, bool skip = true) {
  v1::JobSpec spec;
  spec.set_job_id("fused");
  v1::TensorSpec* t = spec.add_tensors();
  t->set_name("w");
  t->add_shape(kRows);
  t->add_shape(kCols);
  spec.set_world_size(kWorld);
  spec.set_wire_dtype(v1::DTYPE_BF16);
  spec.set_mode(v1::MODE_ZENFLOW);
  spec.mutable_zenflow()->set_topk_ratio(0);
  spec.mutable_zenflow()->set_update_interval(2);
  spec.mutable_zenflow()->set_select_interval(1 << 20);
  spec.set_rank_ordered_sums(rank_ordered);
  spec.set_skip_nonfinite_rounds(skip);
  EXPECT_TRUE(registry->CreateJob(spec).ok());
  std::shared_ptr<Job> job = *registry->Find("fused");
  std::vector<float> init(kRows * kCols);
  for (size_t i = 0; i < init.size(); ++i) init[i] = 0.01f * static_cast<float>(i % 37);
  UploadWAndJoin(job, kRows, kCols, init, kWorld);
  return job;
}

// Sends rank's shard of every column of `step` (bf16), with a NaN at
// `nan_at` unless that is beyond the shard; in 333-byte pieces (a bf16 cut
// in two at every other piece boundary) or in the message.
absl::Status SendShard(Job* job, int rank, int64_t step, bool pieces, size_t nan_at) {
  std::vector<float> g(kRows * kCols);
  for (size_t i = 0; i < g.size(); ++i) {
    g[i] = 0.0625f * static_cast<float>((rank * 7 + step * 5 + i) % 17) - 0.5f;
  }
  if (nan_at < g.size()) g[nan_at] = std::nanf("");
  std::string payload(g.size() * 2, '\0');
  Encode(DType::kBF16, g.data(), g.size(), payload.data());
  v1::UpMessage m;
  v1::GradientShard* s = m.mutable_shard();
  s->set_step(step);
  s->set_tensor("w");
  for (int c = 0; c < kCols; ++c) s->add_columns(c);
  if (pieces) {
    ShardPayload p;
    for (size_t at = 0; at < payload.size(); at += 333) {
      p.Append(absl::string_view(payload).substr(at, 333));
    }
    return job->HandleUp(rank, m, Wire::kGrpc, &p);
  }
  s->set_payload(payload);
  return job->HandleUp(rank, m, Wire::kUcx);
}

constexpr size_t kNone = size_t{1} << 40;

// Three rounds; in round 1 rank 1's shard of step 2 has a NaN at `nan_at`
// (none when beyond the shard). Without `skip` (the default mode) that
// shard is rejected, naming the NaN's column and row, and then sent again
// without it.
std::string ThreeRounds(bool rank_ordered, bool pieces, size_t nan_at, bool skip = true) {
  JobRegistry registry{RegistryOptions{}};
  std::shared_ptr<Job> job = MakeJob(&registry, rank_ordered, skip);
  for (int64_t round = 0; round < 3; ++round) {
    for (int64_t step = 2 * round; step < 2 * round + 2; ++step) {
      for (int rank = 0; rank < kWorld; ++rank) {
        const bool bad = round == 1 && step == 2 && rank == 1 && nan_at < kRows * kCols;
        if (bad && !skip) {
          const absl::Status st = SendShard(job.get(), rank, step, pieces, nan_at);
          EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
          EXPECT_NE(st.message().find(absl::StrCat("non-finite gradient in column ",
                                                   nan_at / kRows, " row ", nan_at % kRows,
                                                   " of step 2")),
                    absl::string_view::npos)
              << st;
        }
        const absl::Status st =
            SendShard(job.get(), rank, step, pieces, bad && skip ? nan_at : kNone);
        EXPECT_TRUE(st.ok()) << st;  // accepted (a NaN's round is skipped instead)
      }
    }
    for (int rank = 0; rank < kWorld; ++rank) {
      v1::UpMessage close;
      close.mutable_close()->set_round(round);
      close.mutable_close()->set_lr(0.01f);
      EXPECT_TRUE(job->HandleUp(rank, close, Wire::kGrpc).ok());
    }
    EXPECT_TRUE(job->Snapshot().ok());  // waits for the round's update
  }
  v1::JobStats stats;
  job->Stats(&stats);
  EXPECT_EQ(stats.rounds_skipped_nonfinite(), skip && nan_at < kRows * kCols ? 1 : 0);
  std::vector<int32_t> all(kCols);
  for (int c = 0; c < kCols; ++c) all[c] = c;
  absl::StatusOr<v1::ColumnState> state = job->ReadColumns("w", all);
  EXPECT_TRUE(state.ok()) << state.status();
  return state.ok() ? state->SerializeAsString() : "";
}

TEST(ShardPathTest, AStoppedAddLeavesNoTraceInASkippedRound) {
  for (bool rank_ordered : {false, true}) {
    for (bool pieces : {false, true}) {
      SCOPED_TRACE(std::string(rank_ordered ? "rank-ordered" : "shared") +
                   (pieces ? ", in pieces" : ", in the message"));
      const std::string want = ThreeRounds(rank_ordered, pieces, 0);  // nothing added
      ASSERT_FALSE(want.empty());
      // Late in the third block: two blocks were added before the NaN.
      EXPECT_EQ(ThreeRounds(rank_ordered, pieces, 2 * kFusedBlockElements + 100), want);
      EXPECT_EQ(ThreeRounds(rank_ordered, pieces, kRows * kCols - 1), want);
      // (The comparison sees round 1: with it updated the state differs.)
      EXPECT_NE(ThreeRounds(rank_ordered, pieces, kRows * kCols), want);
    }
  }
}

TEST(ShardPathTest, ARejectedShardLeavesTheSumsBitForBitAndTheGoodOneAfterItIsExact) {
  for (bool rank_ordered : {false, true}) {
    for (bool pieces : {false, true}) {
      SCOPED_TRACE(std::string(rank_ordered ? "rank-ordered" : "shared") +
                   (pieces ? ", in pieces" : ", in the message"));
      // No bad shard at all: the job every rejection must end at.
      const std::string want = ThreeRounds(rank_ordered, pieces, kNone, /*skip=*/false);
      ASSERT_FALSE(want.empty());
      // The NaN first, in the value the first piece boundary cuts in two,
      // in the third block of the fused add, last.
      for (size_t nan_at : {size_t{0}, size_t{166}, 2 * kFusedBlockElements + 100,
                            size_t{kRows * kCols - 1}}) {
        SCOPED_TRACE(nan_at);
        EXPECT_EQ(ThreeRounds(rank_ordered, pieces, nan_at, /*skip=*/false), want);
      }
    }
  }
}

}  // namespace
}  // namespace zenflow
