// The UCX receive path allocates nothing per message once warm: a counting
// global operator new (tests/testing/counting_new.h) counts, per thread, the allocations
// of the receiving worker's progress thread while many shard frames (header
// and payload, split as the client library sends them) go through a real
// UcxWorker pair over shared memory, and of a dispatcher-like thread that
// parses them with an UpFrameParser and gives their buffers back; and the
// parser reads every frame as ParseFrame into a new message does.
//
// Only allocations through operator new are counted (UCX's own, through
// malloc, are not: it takes its requests and fragments from its memory
// pools).
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <thread>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "common/ucx.h"
#include "common/ucx_frame.h"
#include "gtest/gtest.h"
#include "tests/testing/counting_new.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {
namespace {

// A shard frame as the client library sends it: the payload and the
// header (the message without its payload, and the trailer).
struct ShardFrame {
  std::string payload, header;
};

ShardFrame MakeShardFrame(size_t payload_bytes, int64_t step) {
  v1::UpMessage m;
  m.set_seq(step + 1);
  v1::GradientShard* s = m.mutable_shard();
  s->set_step(step);
  s->set_tensor("model.layers.0.mlp.up_proj.weight");
  s->set_dtype(v1::DTYPE_FP32);
  const int64_t columns = static_cast<int64_t>(payload_bytes / 4096);
  for (int64_t c = 0; c < columns; ++c) s->add_columns(static_cast<int32_t>(c * 3));
  s->set_payload(std::string(payload_bytes, '\x11'));
  ShardFrame f;
  SplitFrame(&m, &f.payload, &f.header);
  return f;
}

// Receives frames on the worker's progress thread and records, per
// message, how many allocations that thread had made so far; hands the
// frames to a consumer thread that parses them (UpFrameParser) and recycles
// their buffers, as zenflowd's UCX data plane does.
class Receiver {
 public:
  explicit Receiver(size_t expected) : progress_counts_(expected, -1), parse_counts_(expected, -1) {
    queue_.reserve(expected);
    taken_.reserve(expected);
  }
  UcxWorker::RecvFn Fn() {
    return [this](uint64_t, std::string frame) {
      const int64_t n = ThisThreadAllocations();
      MutexLock lock(&mu_);
      if (received_ < progress_counts_.size()) progress_counts_[received_] = n;
      // Between the counted messages, an allocation of this thread writes
      // its stack (a failure then says where it came from).
      if (received_ == trace_from_) TraceThisThreadAllocations(true);
      if (received_ + 1 == progress_counts_.size()) TraceThisThreadAllocations(false);
      ++received_;
      queue_.push_back(std::move(frame));
    };
  }
  void TraceFrom(size_t message) {
    MutexLock lock(&mu_);
    trace_from_ = message;
  }
  void Attach(UcxWorker* w) { worker_ = w; }

  // The consumer: parses and recycles until `count` frames were handled.
  void Consume(size_t count) {
    UpFrameParser parser;
    size_t handled = 0;
    while (handled < count) {
      {
        MutexLock lock(&mu_);
        if (!mu_.AwaitWithTimeout(
                [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !queue_.empty(); },
                absl::Seconds(60))) {
          return;
        }
        taken_.swap(queue_);
      }
      for (std::string& frame : taken_) {
        absl::StatusOr<v1::UpMessage*> up = parser.Parse(std::move(frame));
        if (up.ok() && (*up)->kind_case() == v1::UpMessage::kShard) {
          sizes_ok_ &= !(*up)->shard().payload().empty() && (*up)->shard().columns_size() > 0;
          worker_->Recycle(std::move(*(*up)->mutable_shard()->mutable_payload()));
        } else {
          parse_ok_ = false;
        }
        if (handled < parse_counts_.size()) parse_counts_[handled] = ThisThreadAllocations();
        ++handled;
        handled_.fetch_add(1, std::memory_order_release);
      }
      taken_.clear();
    }
  }

  // Allocations of the progress thread between messages `from` and `to`.
  int64_t ProgressAllocations(size_t from, size_t to) {
    MutexLock lock(&mu_);
    return progress_counts_[to] - progress_counts_[from];
  }
  int64_t ParseAllocations(size_t from, size_t to) const {
    return parse_counts_[to] - parse_counts_[from];
  }
  bool parse_ok() const { return parse_ok_ && sizes_ok_; }
  size_t handled() const { return handled_.load(std::memory_order_acquire); }

 private:
  UcxWorker* worker_ = nullptr;
  Mutex mu_;
  std::vector<int64_t> progress_counts_ ABSL_GUARDED_BY(mu_);
  size_t received_ ABSL_GUARDED_BY(mu_) = 0;
  size_t trace_from_ ABSL_GUARDED_BY(mu_) = SIZE_MAX;
  std::vector<std::string> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> taken_;  // the consumer's
  std::vector<int64_t> parse_counts_;  // the consumer's
  bool parse_ok_ = true, sizes_ok_ = true;
  std::atomic<size_t> handled_{0};
};

// Sends `count` frames from a to b with at most `window` of them sent and
// not yet handled by the consumer (so that the buffers in use stay as many
// as during the warm-up, whatever the threads' scheduling), and checks the
// receiving side.
void PushFrames(const UcxOptions& options, size_t payload_bytes, size_t count, size_t window) {
  Receiver rx(count);
  auto b = UcxWorker::Create(options, rx.Fn());
  ASSERT_TRUE(b.ok()) << b.status();
  rx.Attach(b->get());
  auto a = UcxWorker::Create(options, [](uint64_t, std::string) {});
  ASSERT_TRUE(a.ok()) << a.status();
  auto ep = (*a)->Connect((*b)->address());
  ASSERT_TRUE(ep.ok()) << ep.status();

  std::vector<ShardFrame> frames;
  for (size_t i = 0; i < window; ++i) frames.push_back(MakeShardFrame(payload_bytes, i));
  // Warm means the buffer pool holds as many buffers as can be out at once:
  // `window` (how many a worker's pool holds is how many its readers once
  // held together, and the warm-up below need not reach that by itself).
  const size_t frame_bytes = frames[0].payload.size() + frames[0].header.size();
  for (size_t i = 0; i < window; ++i) {
    std::string buffer;
    buffer.reserve(frame_bytes + 4096);
    (*b)->Recycle(std::move(buffer));
  }
  const size_t warm = count / 4;
  rx.TraceFrom(warm + 1);
  std::thread consumer([&] { rx.Consume(count); });
  Mutex mu;
  size_t in_flight = 0, failed = 0;
  for (size_t i = 0; i < count; ++i) {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (i >= rx.handled() + window) {
      ASSERT_LT(absl::Now(), deadline) << "frame " << i - window << " was never handled";
      absl::SleepFor(absl::Microseconds(50));
    }
    {
      MutexLock lock(&mu);
      ++in_flight;
    }
    const ShardFrame& f = frames[i % window];
    (*a)->Send(*ep, 7, {f.payload, f.header}, [&](absl::Status s) {
      MutexLock lock(&mu);
      --in_flight;
      if (!s.ok()) ++failed;
    });
  }
  consumer.join();
  {
    MutexLock lock(&mu);
    mu.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return in_flight == 0; },
                        absl::Seconds(60));
    EXPECT_EQ(failed, 0u);
  }
  ASSERT_TRUE(rx.parse_ok());
  EXPECT_EQ((*b)->stats().messages_received, static_cast<int64_t>(count));
  // Warm after a quarter of the messages (vectors at their size); none
  // allocates from then on.
  EXPECT_EQ(rx.ProgressAllocations(warm, count - 1), 0)
      << "the receiving progress thread allocated over " << (count - 1 - warm) << " messages of "
      << payload_bytes << " bytes";
  EXPECT_EQ(rx.ParseAllocations(warm, count - 1), 0)
      << "parsing and recycling allocated over " << (count - 1 - warm) << " frames";
}

UcxOptions DaemonLike() {
  UcxOptions o;
  o.without_cma = true;  // as zenflowd's data plane
  o.scan_nonfinite = true;  // its bodies through the scanning copy
  return o;
}

TEST(UcxAllocations, SplitShardFramesAllocateNothingOnceWarm) {
  // 256 KiB payloads travel as two UCX messages (header, then payload).
  PushFrames(DaemonLike(), 256 << 10, 400, 8);
}

TEST(UcxAllocations, LargeShardFramesAllocateNothingOnceWarm) {
  PushFrames(DaemonLike(), 4 << 20, 120, 4);
}

TEST(UcxAllocations, SmallFramesAllocateNothingOnceWarm) {
  // Below the split size: one contiguous message each.
  PushFrames(DaemonLike(), 16 << 10, 600, 16);
}

// The reused message reads each frame of a mixed sequence exactly as a new
// message does (nothing of an earlier frame stays behind), and fails where
// ParseFrame fails.
TEST(UpFrameParser, ReadsEveryFrameAsParseFrameDoes) {
  std::vector<std::string> frames;
  auto add = [&](v1::UpMessage m) {
    std::string payload, header;
    SplitFrame(&m, &payload, &header);
    frames.push_back(payload + header);
  };
  v1::UpMessage big;
  big.set_seq(1);
  big.set_replay(true);
  big.mutable_shard()->set_step(9);
  big.mutable_shard()->set_tensor("a.long.tensor.name.that.is.not.short");
  big.mutable_shard()->set_selection_version(4);
  for (int c = 0; c < 50; ++c) big.mutable_shard()->add_columns(c);
  big.mutable_shard()->add_scales(0.5f);
  big.mutable_shard()->set_dtype(v1::DTYPE_INT8);
  big.mutable_shard()->set_payload(std::string(50 * 8, '\x03'));
  add(big);
  v1::UpMessage small;  // fewer fields: the earlier ones must not linger
  small.mutable_shard()->set_tensor("t");
  small.mutable_shard()->add_columns(2);
  small.mutable_shard()->set_payload("abcd");
  add(small);
  v1::UpMessage close;
  close.set_seq(3);
  close.mutable_close()->set_round(2);
  add(close);
  add(v1::UpMessage());                        // empty: no kind
  v1::UpMessage empty_shard;
  empty_shard.mutable_shard();
  add(empty_shard);                            // a shard with nothing set
  v1::UpMessage attach;
  attach.mutable_attach()->set_job_id("j");
  add(attach);
  add(big);
  // A header whose payload field is set (the payload inside the header).
  {
    std::string header;
    small.AppendToString(&header);
    const uint32_t n = static_cast<uint32_t>(header.size());
    header.append(reinterpret_cast<const char*>(&n), 4);
    header.append(reinterpret_cast<const char*>(&kUcxFrameMagic), 4);
    frames.push_back(header);
  }
  frames.push_back("short");
  frames.push_back(std::string(40, '\xff'));
  {
    std::string bad = "\x1a\x7f";  // shard field longer than the header
    const uint32_t n = static_cast<uint32_t>(bad.size());
    bad.append(reinterpret_cast<const char*>(&n), 4);
    bad.append(reinterpret_cast<const char*>(&kUcxFrameMagic), 4);
    frames.push_back(bad);
  }
  add(small);

  UpFrameParser parser;
  for (size_t i = 0; i < frames.size(); ++i) {
    v1::UpMessage want;
    const absl::Status ws = ParseFrame(frames[i], &want);
    absl::StatusOr<v1::UpMessage*> got = parser.Parse(frames[i]);
    ASSERT_EQ(got.status().code(), ws.code()) << "frame " << i << ": " << got.status() << " vs " << ws;
    if (!ws.ok()) continue;
    EXPECT_EQ((*got)->SerializeAsString(), want.SerializeAsString()) << "frame " << i;
    EXPECT_EQ((*got)->kind_case(), want.kind_case()) << "frame " << i;
  }
}

TEST(UcxAllocations, TheCounterCounts) {
  // The test's own instrument: an allocation on this thread is seen.
  const int64_t before = ThisThreadAllocations();
  auto* p = new std::string(1000, 'x');
  EXPECT_GT(ThisThreadAllocations(), before);
  delete p;
}

}  // namespace
}  // namespace zenflow
