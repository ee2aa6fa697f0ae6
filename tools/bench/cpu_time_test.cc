// The per-thread CPU accounting scale_bench charges round updates with:
// NamedThreadsCpuDelta over snapshots of threads that come, go or reuse an
// id, and ReadThreadCpu of this process (its threads by name).
#include "tools/bench/cpu_time.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace zenflow {
namespace {

TEST(NamedThreadsCpuDelta, CountsNamedThreadsAcrossComingAndGoing) {
  ThreadCpuSnapshot start = {
      {10, {"zf-update", 1.0}},  // runs through: +0.5
      {11, {"zf-update", 2.0}},  // ends before `end`: lost
      {12, {"grpc", 5.0}},       // another name: not counted
      {13, {"zf-update", 9.0}},  // id reused by a new thread (less CPU): from 0
      {14, {"grpc", 1.0}},       // id reused under the update name: from 0
  };
  ThreadCpuSnapshot end = {
      {10, {"zf-update", 1.5}},
      {12, {"grpc", 7.0}},
      {13, {"zf-update", 0.25}},
      {14, {"zf-update", 0.125}},
      {15, {"zf-update", 0.0625}},  // started in between: from 0
  };
  EXPECT_DOUBLE_EQ(NamedThreadsCpuDelta(start, end, "zf-update"), 0.5 + 0.25 + 0.125 + 0.0625);
  EXPECT_DOUBLE_EQ(NamedThreadsCpuDelta(start, end, "grpc"), 2.0);
  EXPECT_DOUBLE_EQ(NamedThreadsCpuDelta(start, end, "nobody"), 0.0);
  EXPECT_DOUBLE_EQ(NamedThreadsCpuDelta({}, end, "grpc"), 7.0);
}

TEST(ReadThreadCpu, ListsThisProcessThreadsByName) {
  std::atomic<bool> named{false}, done{false};
  std::thread t([&] {
    pthread_setname_np(pthread_self(), "zf-cpu-test");
    named = true;
    while (!done) std::this_thread::yield();
  });
  while (!named) std::this_thread::yield();
  absl::StatusOr<ThreadCpuSnapshot> snap = ReadThreadCpu(getpid());
  done = true;
  t.join();
  ASSERT_TRUE(snap.ok()) << snap.status();
  int found = 0;
  for (const auto& [tid, th] : *snap) {
    EXPECT_GE(th.cpu_s, 0.0);
    if (th.comm == "zf-cpu-test") ++found;
  }
  EXPECT_EQ(found, 1);
  EXPECT_TRUE(snap->count(getpid()) == 1);  // the main thread's id is the process id
  EXPECT_FALSE(ReadThreadCpu(-1).ok());
}

}  // namespace
}  // namespace zenflow
