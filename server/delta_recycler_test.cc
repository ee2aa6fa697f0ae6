#include "server/delta_recycler.h"

#include <cmath>
#include <string>
#include <vector>

#include "common/thread_pool.h"
#include "gtest/gtest.h"
#include "server/round_accumulator.h"
#include "server/round_update.h"
#include "server/tensor_store.h"

namespace zenflow {
namespace {

constexpr size_t kBig = DeltaRecycler::kMinBytes;

v1::DownMessage DeltaWith(size_t payload, size_t m, size_t v, char fill) {
  v1::DownMessage d;
  d.mutable_delta()->set_payload(std::string(payload, fill));
  d.mutable_delta()->set_m(std::string(m, fill));
  d.mutable_delta()->set_v(std::string(v, fill));
  return d;
}

TEST(DeltaRecyclerTest, TakesTheBestFitAndDropsSmallBuffers) {
  DeltaRecycler r(int64_t{64} << 20);
  v1::DownMessage d = DeltaWith(4 * kBig, 2 * kBig, kBig / 2, 'x');
  r.Recycle(&d);
  // payload and m kept; v is below kMinBytes.
  EXPECT_GE(r.stats().spare_bytes, static_cast<int64_t>(6 * kBig));
  EXPECT_LT(r.stats().spare_bytes, static_cast<int64_t>(7 * kBig));
  // 2.5 kBig: the 4 kBig buffer is within [n, 2n], the 2 kBig one is too small.
  std::string s = r.Take(5 * kBig / 2);
  EXPECT_GE(s.capacity(), 4 * kBig);
  EXPECT_EQ(s.size(), 4 * kBig);  // as it was: the caller resizes
  // 5 kBig: the 2 kBig buffer left is too small.
  EXPECT_EQ(r.Take(5 * kBig).capacity(), std::string().capacity());
  // kBig / 2: below kMinBytes, never served.
  EXPECT_EQ(r.Take(kBig / 2).capacity(), std::string().capacity());
  // 1 kBig: 2 kBig is within [n, 2n].
  EXPECT_GE(r.Take(kBig).capacity(), 2 * kBig);
  const DeltaRecycler::Stats st = r.stats();
  EXPECT_EQ(st.taken, 2);
  EXPECT_EQ(st.missed, 1);
  EXPECT_EQ(st.spare_bytes, 0);
  EXPECT_GE(st.held_bytes, static_cast<int64_t>(6 * kBig));
}

TEST(DeltaRecyclerTest, SparesAndHeldBytesStayWithinTheLimit) {
  const int64_t limit = static_cast<int64_t>(8 * kBig);
  DeltaRecycler r(limit);
  r.Hold(static_cast<int64_t>(5 * kBig));
  v1::DownMessage d = DeltaWith(2 * kBig, 2 * kBig, 2 * kBig, 'y');
  r.Recycle(&d);  // room for one of the three
  EXPECT_LE(r.stats().spare_bytes + r.stats().held_bytes, limit);
  EXPECT_GE(r.stats().spare_bytes, static_cast<int64_t>(2 * kBig));
  EXPECT_LT(r.stats().spare_bytes, static_cast<int64_t>(4 * kBig));
  r.Release(static_cast<int64_t>(5 * kBig));
  v1::DownMessage e = DeltaWith(2 * kBig, 2 * kBig, 2 * kBig, 'z');
  r.Recycle(&e);
  EXPECT_LE(r.stats().spare_bytes, limit);
  EXPECT_EQ(r.stats().held_bytes, 0);
  // A message that is not a delta gives nothing.
  v1::DownMessage done;
  done.mutable_done()->set_round(3);
  const int64_t before = r.stats().spare_bytes;
  r.Recycle(&done);
  EXPECT_EQ(r.stats().spare_bytes, before);
}

// One large update (bf16 values with m and v, messages of 256 KiB) into a
// sink; with `recycler` the sink gives every message back to it, as the
// outboxes' deleter does.
std::string RunUpdate(DeltaRecycler *recycler, int64_t *messages) {
  constexpr int64_t kR = 256, kC = 1024;
  TensorStore store({{kR, kC}});
  RoundAccumulator acc({{kR, kC}}, 1, false);
  std::vector<RoundUpdateTensor> tensors{{"w", kR, DType::kBF16}};
  std::vector<std::vector<int32_t>> remote(1);
  for (int32_t c = 0; c < kC; ++c) {
    if (c % 10 != 3) remote[0].push_back(c);
    store.set_count(0, c, 1);
    for (int64_t i = 0; i < kR; ++i) {
      store.master(0, c)[i] = std::sin(0.01f * static_cast<float>(i * kC + c));
      acc.sum(0, 0, c)[i] = std::cos(0.003f * static_cast<float>(i * 7 + c));
    }
  }
  ThreadPool pool(2);
  RoundUpdateInput in;
  in.round = 0;
  in.steps_sum = 1;
  in.lr = 1e-3f;
  in.tensors = &tensors;
  in.remote = &remote;
  in.moments = true;
  in.max_shard_bytes = 256 << 10;
  in.window_bytes = 512 << 10;
  in.pool = &pool;
  in.recycler = recycler;
  std::string all;
  *messages = 0;
  in.sink = [&](v1::DownMessage d) {
    all += d.SerializeAsString();
    ++*messages;
    if (recycler != nullptr) recycler->Recycle(&d);
  };
  RoundUpdateResult r = UpdateRound(in, UpdateLease::Grant(0, &store, &acc));
  EXPECT_FALSE(r.skipped);
  return all;
}

// Buffers with stale bytes, longer or shorter than the message (within
// their capacity), give the same messages as fresh ones: every byte is
// overwritten; and the buffers of one update serve the next.
TEST(DeltaRecyclerTest, RecycledBuffersGiveTheSameMessages) {
  int64_t n = 0;
  const std::string fresh = RunUpdate(nullptr, &n);
  ASSERT_GT(n, 4);

  DeltaRecycler r(int64_t{64} << 20);
  for (size_t size : {size_t{180} << 10, size_t{100} << 10, size_t{60} << 10, size_t{300} << 10}) {
    for (int k = 0; k < 8; ++k) {
      v1::DownMessage d;
      std::string s;
      s.reserve(size + (size_t{64} << 10));  // room beyond its stale bytes
      s.assign(size, static_cast<char>(0xab));
      *d.mutable_delta()->mutable_payload() = std::move(s);
      d.mutable_delta()->set_m(std::string(size, static_cast<char>(0xcd)));
      d.mutable_delta()->set_v(std::string(size / 2 + 1, static_cast<char>(0xef)));
      r.Recycle(&d);
    }
  }
  int64_t m = 0;
  EXPECT_EQ(RunUpdate(&r, &m), fresh);
  EXPECT_EQ(m, n);
  const DeltaRecycler::Stats first = r.stats();
  EXPECT_GT(first.taken, 0);
  EXPECT_EQ(first.held_bytes, 0);  // all handed on

  // Starting empty: the first batches' buffers, handed back by the sink,
  // serve the later batches of the same update; the next update takes
  // every buffer of kMinBytes or more from the spares.
  DeltaRecycler steady(int64_t{64} << 20);
  EXPECT_EQ(RunUpdate(&steady, &m), fresh);
  const DeltaRecycler::Stats warm = steady.stats();
  EXPECT_GT(warm.taken, 0);
  EXPECT_GT(warm.missed, 0);
  EXPECT_GT(warm.spare_bytes, 0);
  EXPECT_EQ(RunUpdate(&steady, &m), fresh);
  const DeltaRecycler::Stats second = steady.stats();
  EXPECT_GT(second.taken, warm.taken);
  EXPECT_EQ(second.missed, warm.missed);  // nothing new missed
  EXPECT_EQ(second.held_bytes, 0);
}

}  // namespace
}  // namespace zenflow
