// Tests for common/thread_pool: coverage of the index space, partitioning
// rules, concurrency between callers, and exception propagation.

#include "common/thread_pool.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <numeric>
#include <set>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace zenflow {
namespace {

using Range = std::pair<size_t, size_t>;

// Runs ParallelFor and returns the chunks it produced, sorted.
std::vector<Range> Chunks(ThreadPool* pool, size_t n, size_t grain) {
  std::mutex mu;
  std::vector<Range> out;
  pool->ParallelFor(n, grain, [&](size_t b, size_t e) {
    std::lock_guard<std::mutex> lock(mu);
    out.emplace_back(b, e);
  });
  std::sort(out.begin(), out.end());
  return out;
}

TEST(ThreadPoolTest, NumThreads) {
  EXPECT_EQ(ThreadPool(1).num_threads(), 1);
  EXPECT_EQ(ThreadPool(3).num_threads(), 3);
  EXPECT_EQ(ThreadPool(0).num_threads(), 1);
}

TEST(ThreadPoolTest, ZeroItemsCallsNothing) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    int calls = 0;
    pool.ParallelFor(0, 1, [&](size_t, size_t) { ++calls; });
    pool.ParallelFor(0, 0, [&](size_t, size_t) { ++calls; });
    EXPECT_EQ(calls, 0);
  }
}

TEST(ThreadPoolTest, Sums) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (size_t n : {1, 2, 7, 100, 12345, 1000000}) {
      std::atomic<uint64_t> total{0};
      pool.ParallelFor(n, 1, [&](size_t b, size_t e) {
        uint64_t s = 0;
        for (size_t i = b; i < e; ++i) s += i;
        total += s;
      });
      EXPECT_EQ(total.load(), static_cast<uint64_t>(n) * (n - 1) / 2)
          << threads << " " << n;
    }
  }
}

TEST(ThreadPoolTest, EveryIndexExactlyOnce) {
  for (int threads : {1, 2, 5}) {
    ThreadPool pool(threads);
    for (size_t n : {1, 3, 5, 6, 64, 1001}) {
      for (size_t grain : {0, 1, 2, 7, 100, 5000}) {
        std::vector<std::atomic<int>> hits(n);
        for (auto& h : hits) h = 0;
        pool.ParallelFor(n, grain, [&](size_t b, size_t e) {
          ASSERT_LT(b, e);
          ASSERT_LE(e, n);
          for (size_t i = b; i < e; ++i) ++hits[i];
        });
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(hits[i].load(), 1) << threads << " " << n << " " << grain;
        }
      }
    }
  }
}

TEST(ThreadPoolTest, GrainAndChunkCountRespected) {
  ThreadPool pool(4);
  for (size_t n : {1, 9, 10, 39, 40, 41, 1000}) {
    for (size_t grain : {1, 10, 25}) {
      const std::vector<Range> chunks = Chunks(&pool, n, grain);
      const size_t expected =
          std::max<size_t>(1, std::min<size_t>(4, n / grain));
      ASSERT_EQ(chunks.size(), expected) << n << " " << grain;
      size_t next = 0;
      size_t min_size = n, max_size = 0;
      for (const Range& r : chunks) {
        EXPECT_EQ(r.first, next);  // Contiguous, in order.
        next = r.second;
        min_size = std::min(min_size, r.second - r.first);
        max_size = std::max(max_size, r.second - r.first);
      }
      EXPECT_EQ(next, n);
      if (n >= grain) {
        EXPECT_GE(min_size, grain) << n << " " << grain;
      }
      EXPECT_LE(max_size - min_size, 1u);  // Balanced.
    }
  }
}

TEST(ThreadPoolTest, PartitionIsDeterministic) {
  ThreadPool pool(3);
  const std::vector<Range> first = Chunks(&pool, 1000, 1);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(Chunks(&pool, 1000, 1), first);
  const std::vector<Range> want = {{0, 334}, {334, 667}, {667, 1000}};
  EXPECT_EQ(first, want);
}

TEST(ThreadPoolTest, SingleThreadRunsInlineOnCaller) {
  ThreadPool pool(1);
  const std::thread::id me = std::this_thread::get_id();
  const std::vector<Range> chunks = Chunks(&pool, 100, 1);
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(chunks[0], Range(0, 100));
  pool.ParallelFor(100, 1, [&](size_t, size_t) {
    EXPECT_EQ(std::this_thread::get_id(), me);
  });
}

TEST(ThreadPoolTest, UsesDistinctThreadsIncludingCaller) {
  ThreadPool pool(3);
  std::mutex mu;
  std::set<std::thread::id> ids;
  pool.ParallelFor(3, 1, [&](size_t, size_t) {
    std::lock_guard<std::mutex> lock(mu);
    ids.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids.count(std::this_thread::get_id()), 1u);
}

TEST(ThreadPoolTest, ConcurrentCallers) {
  ThreadPool pool(3);
  constexpr int kRounds = 200;
  auto caller = [&pool](uint64_t salt, bool* ok) {
    for (int r = 0; r < kRounds; ++r) {
      const size_t n = 1000 + r;
      std::vector<uint64_t> out(n, 0);
      pool.ParallelFor(n, 16, [&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i) out[i] += i * salt;
      });
      for (size_t i = 0; i < n; ++i) {
        if (out[i] != i * salt) {
          *ok = false;
          return;
        }
      }
    }
    *ok = true;
  };
  bool ok1 = false, ok2 = false;
  std::thread t1(caller, 3, &ok1);
  std::thread t2(caller, 5, &ok2);
  t1.join();
  t2.join();
  EXPECT_TRUE(ok1);
  EXPECT_TRUE(ok2);
}

TEST(ThreadPoolTest, ManySmallJobs) {
  ThreadPool pool(2);
  std::atomic<uint64_t> total{0};
  for (int r = 0; r < 5000; ++r) {
    pool.ParallelFor(2, 1, [&](size_t b, size_t e) { total += e - b; });
  }
  EXPECT_EQ(total.load(), 10000u);
}

TEST(ThreadPoolTest, ExceptionPropagatesAfterAllChunks) {
  ThreadPool pool(3);
  std::atomic<int> finished{0};
  EXPECT_THROW(pool.ParallelFor(3, 1,
                                [&](size_t b, size_t) {
                                  if (b != 0) {
                                    ++finished;
                                    throw std::runtime_error("boom");
                                  }
                                  ++finished;
                                }),
               std::runtime_error);
  EXPECT_EQ(finished.load(), 3);
  // The pool is still usable afterwards.
  std::atomic<int> calls{0};
  pool.ParallelFor(3, 1, [&](size_t, size_t) { ++calls; });
  EXPECT_EQ(calls.load(), 3);
}

// ForEach runs every index exactly once, over more tasks than threads of
// very uneven sizes, and rethrows after the others ran.
TEST(ThreadPoolTest, ForEachRunsEveryIndexOnce) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(1000);
  pool.ForEach(hits.size(), [&](size_t i) {
    if (i % 97 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    ++hits[i];
  });
  for (size_t i = 0; i < hits.size(); ++i) EXPECT_EQ(hits[i].load(), 1) << i;
  std::atomic<int> ran{0};
  EXPECT_THROW(pool.ForEach(10,
                            [&](size_t i) {
                              ++ran;
                              if (i == 2) throw std::runtime_error("boom");
                            }),
               std::runtime_error);
  EXPECT_EQ(ran.load(), 10);
  pool.ForEach(0, [&](size_t) { ADD_FAILURE() << "no index"; });
}

}  // namespace
}  // namespace zenflow

namespace zenflow {
namespace {

int NiceOfThisThread() {
  errno = 0;
  return getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
}

// The pool's background threads start with the creator's nice value plus
// nice_delta (a positive delta needs no privilege); the caller, which
// runs chunk 0, keeps its own.
TEST(ThreadPoolTest, BackgroundThreadsTakeTheNiceDelta) {
  const int base = NiceOfThisThread();
  if (base > 16) GTEST_SKIP() << "the test runs at nice " << base;
  ThreadPool pool(3, "zf-nice-test", 2);
  std::mutex mu;
  std::vector<int> nice(3, -100);
  pool.ParallelFor(3, 1, [&](size_t b, size_t) {
    std::lock_guard<std::mutex> lock(mu);
    nice[b] = NiceOfThisThread();
  });
  EXPECT_EQ(nice[0], base);
  EXPECT_EQ(nice[1], base + 2);
  EXPECT_EQ(nice[2], base + 2);
  EXPECT_EQ(NiceOfThisThread(), base);
}

// A negative delta is applied with CAP_SYS_NICE, else refused with
// PERMISSION_DENIED and nothing changed; only the calling thread moves.
TEST(ThreadPoolTest, AdjustThreadNiceMovesOnlyTheCallingThread) {
  const int base = NiceOfThisThread();
  if (base < -18) GTEST_SKIP() << "the test runs at nice " << base;
  absl::Status s;
  int after = 0;
  std::thread t([&] {
    s = AdjustThreadNice(-1);
    after = NiceOfThisThread();
  });
  t.join();
  if (s.ok()) {
    EXPECT_EQ(after, base - 1);
  } else {
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
    EXPECT_EQ(after, base);
  }
  EXPECT_EQ(NiceOfThisThread(), base);
  EXPECT_TRUE(AdjustThreadNice(0).ok());
}

}  // namespace
}  // namespace zenflow
