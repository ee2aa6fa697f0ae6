// The shard path allocates nothing per shard: global operator new/delete
// are replaced here by counting ones, and many rounds of shards of several
// ranks go through the real path:
//
//   Job::HandleUp        shards with their payload in the message (the UCX
//                        data plane's form, and protobuf's) or in pieces;
//   ParseUpRaw+IngestUp  what the gRPC stream's reactor does per message
//                        (stream_reactor.cc HandleQueued): the message's
//                        bytes in several gRPC slices, the shard's payload
//                        left in them, parsed into one reused UpMessage.
//
// Only the calling thread's allocations are counted (the round updates run
// on the update threads). In steady state a round's shards allocate nothing;
// the round itself may allocate a fixed amount, whatever its number of
// shards: its entry in the job's map of rounds and its divergence sample,
// both made at the round's first shard, and its closes. That is what is
// asserted: rounds of 2 and of 6 shards per rank and step allocate the same.

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "common/codec.h"
#include "common/up_wire.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/ingest.h"
#include "server/job.h"
#include "server/job_test_support.h"
#include "server/raw_message.h"
#include "server/registry.h"
#include "tests/testing/counting_new.h"
#include "zenflow/v1/zenflow.pb.h"

namespace {
// ZF_ALLOC_TRACE=1: the stack of each allocation of round 10 on stderr (to
// find it).
const bool g_trace_wanted = std::getenv("ZF_ALLOC_TRACE") != nullptr;
}  // namespace

namespace zenflow {
namespace {

// Counts this thread's allocations while alive.
class Counting {
 public:
  Counting() : before_(ThisThreadAllocations()) {}
  int64_t count() const { return ThisThreadAllocations() - before_; }

 private:
  const int64_t before_;
};

constexpr int kWorld = 4;
// What a round may allocate at its first shard, whatever its number of
// shards: its RoundState (a std::map node) and the divergence sample's draw
// (Job::RemoteColumnsLocked's vectors, 9 for this one tensor).
constexpr int64_t kPerRound = 10;
constexpr int kRows = 64;
constexpr int kCols = 96;

// How a shard reaches the job.
enum class Path { kInMessage, kPieces, kGrpcSlices };

struct Case {
  v1::DType dtype;
  bool rank_ordered;
  Path path;
};

class ShardAllocTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const Case c = GetParam();
    v1::JobSpec spec;
    spec.set_job_id("alloc");
    v1::TensorSpec* t = spec.add_tensors();
    t->set_name("w");
    t->add_shape(kRows);
    t->add_shape(kCols);
    spec.set_world_size(kWorld);
    spec.set_wire_dtype(c.dtype);
    spec.set_mode(v1::MODE_ZENFLOW);
    spec.mutable_zenflow()->set_topk_ratio(0);  // every column on the daemon
    spec.mutable_zenflow()->set_update_interval(2);
    spec.mutable_zenflow()->set_select_interval(1 << 20);
    spec.set_rank_ordered_sums(c.rank_ordered);
    ASSERT_TRUE(registry_.CreateJob(spec).ok());
    job_ = *registry_.Find("alloc");
    UploadWAndJoin(job_, kRows, kCols, std::vector<float>(kRows * kCols, 0.25f), kWorld);
    ASSERT_FALSE(HasFailure());
    for (int r = 0; r < kWorld; ++r) {
      absl::StatusOr<std::shared_ptr<Mailbox>> box = job_->MailboxFor(r);
      ASSERT_TRUE(box.ok());
      boxes_.push_back(*box);
    }
  }

  // Rank `rank`'s shard of columns [first, first + n) for `step`, its
  // payload apart (`*payload`).
  v1::UpMessage Shard(int rank, int64_t step, int first, int n, std::string* payload) {
    const Case c = GetParam();
    v1::UpMessage m;
    m.set_seq(step * 1000 + first);
    v1::GradientShard* s = m.mutable_shard();
    s->set_step(step);
    s->set_tensor("w");
    std::vector<float> g;
    for (int col = first; col < first + n; ++col) {
      s->add_columns(col);
      for (int r = 0; r < kRows; ++r) {
        g.push_back(0.03125f * static_cast<float>((rank * 5 + step * 3 + col + r) % 13) - 0.2f);
      }
    }
    if (c.dtype == v1::DTYPE_INT8) {
      for (int i = 0; i < n; ++i) s->add_scales(0.01f);
      payload->clear();
      for (float v : g) payload->push_back(static_cast<char>(static_cast<int>(v * 100)));
    } else {
      const DType dt = c.dtype == v1::DTYPE_BF16   ? DType::kBF16
                       : c.dtype == v1::DTYPE_FP16 ? DType::kF16
                                                   : DType::kF32;
      payload->resize(g.size() * DTypeSize(dt));
      Encode(dt, g.data(), g.size(), payload->data());
    }
    return m;
  }

  // Sends `m` (its payload apart in `payload`) the way GetParam().path
  // says; returns the allocations made while the daemon's code ran.
  int64_t Send(int rank, v1::UpMessage m, const std::string& payload) {
    const Path path = GetParam().path;
    absl::Status s;
    int64_t n = 0;
    if (path == Path::kGrpcSlices || !m.has_shard()) {
      // The message's bytes in slices of at most 700 bytes (cut anywhere),
      // as gRPC hands them to the reactor.
      if (m.has_shard()) m.mutable_shard()->set_payload(payload);
      const std::string bytes = m.SerializeAsString();
      std::vector<grpc::Slice> slices;
      for (size_t at = 0; at < bytes.size(); at += 700) {
        slices.emplace_back(bytes.data() + at, std::min<size_t>(700, bytes.size() - at));
      }
      grpc::ByteBuffer buf(slices.data(), slices.size());
      Counting counting;
      bool split = false;
      absl::Status read = ParseUpRaw(&buf, ++index_, &up_, &slices_, &payload_, &split, &registry_);
      s = IngestUp(&registry_, job_.get(), rank, Wire::kGrpc, boxes_[rank].get(), std::move(read),
                   up_, split ? &payload_ : nullptr);
      EXPECT_TRUE(split || !m.has_shard());
      ClearUpKeepingRoom(&up_);
      payload_.Clear();
      slices_.clear();
      n = counting.count();
    } else if (path == Path::kInMessage) {
      m.mutable_shard()->set_payload(payload);
      Counting counting;
      s = job_->HandleUp(rank, m, Wire::kUcx);
      n = counting.count();
    } else {
      // In pieces of 300 bytes: values and columns cut in two.
      ShardPayload pieces;
      pieces.Clear();
      for (size_t at = 0; at < payload.size(); at += 300) {
        pieces.Append(absl::string_view(payload).substr(at, 300));
      }
      Counting counting;
      s = job_->HandleUp(rank, m, Wire::kGrpc, &pieces);
      n = counting.count();
    }
    EXPECT_TRUE(s.ok()) << s;
    return n;
  }

  // One round: every rank sends its 2 steps' shards, `per_step` shards per
  // step, then closes. Returns the allocations of the shards and of the
  // closes; waits for the round's update (not counted).
  void Round(int64_t round, int per_step, int64_t* shard_allocs, int64_t* close_allocs) {
    *shard_allocs = *close_allocs = 0;
    const int width = kCols / per_step;
    std::string payload;
    for (int64_t step = 2 * round; step < 2 * round + 2; ++step) {
      for (int k = 0; k < per_step; ++k) {
        for (int rank = 0; rank < kWorld; ++rank) {
          v1::UpMessage m = Shard(rank, step, k * width, width, &payload);
          *shard_allocs += Send(rank, std::move(m), payload);
        }
      }
    }
    for (int rank = 0; rank < kWorld; ++rank) {
      v1::UpMessage close;
      close.mutable_close()->set_round(round);
      close.mutable_close()->set_lr(0.01f);
      *close_allocs += Send(rank, std::move(close), "");
    }
    ASSERT_TRUE(job_->Snapshot().ok());  // waits for the update
  }

  JobRegistry registry_{RegistryOptions{}};
  std::shared_ptr<Job> job_;
  std::vector<std::shared_ptr<Mailbox>> boxes_;
  // The reactor's reused state (stream_reactor.cc).
  v1::UpMessage up_;
  std::vector<grpc::Slice> slices_;
  ShardPayload payload_;
  int64_t index_ = 0;
};

TEST_P(ShardAllocTest, ShardsAllocateNothingInSteadyState) {
  int64_t shards = 0, closes = 0;
  for (int64_t round = 0; round < 4; ++round) {  // warm-up: first messages of a thread
    Round(round, round % 2 == 0 ? 2 : 6, &shards, &closes);
  }
  int64_t per_round = -1;
  for (int64_t round = 4; round < 16; ++round) {
    const int per_step = round % 2 == 0 ? 2 : 6;
    TraceThisThreadAllocations(g_trace_wanted && round == 10);
    Round(round, per_step, &shards, &closes);
    TraceThisThreadAllocations(false);
    SCOPED_TRACE("round " + std::to_string(round) + ", " + std::to_string(per_step) +
                 " shards per rank and step");
    // Whatever the round's number of shards (16 or 48), the same count:
    // nothing per shard.
    if (per_round < 0) per_round = shards;
    EXPECT_EQ(shards, per_round);
    EXPECT_LE(shards, kPerRound) << "the round's entry and divergence sample, at its first shard";
    EXPECT_LE(closes, 8 * kWorld);
  }
  v1::JobStats stats;
  job_->Stats(&stats);
  EXPECT_EQ(stats.shards_received(), 2 * kWorld * (2 * 2 + 2 * 6) + 2 * kWorld * 6 * (2 + 6));
}

INSTANTIATE_TEST_SUITE_P(
    Paths, ShardAllocTest,
    ::testing::Values(Case{v1::DTYPE_BF16, false, Path::kGrpcSlices},
                      Case{v1::DTYPE_BF16, true, Path::kGrpcSlices},
                      Case{v1::DTYPE_FP32, false, Path::kInMessage},
                      Case{v1::DTYPE_FP16, true, Path::kInMessage},
                      Case{v1::DTYPE_INT8, false, Path::kPieces},
                      Case{v1::DTYPE_BF16, true, Path::kPieces}));

}  // namespace
}  // namespace zenflow
