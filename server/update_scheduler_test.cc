#include "server/update_scheduler.h"

#include <atomic>
#include <vector>

#include "absl/time/time.h"
#include "common/mutex.h"
#include "gtest/gtest.h"

namespace zenflow {
namespace {

// A one-shot event with a bounded wait (the bound is a failure, not a timing).
class Event {
 public:
  void Set() {
    MutexLock lock(&mu_);
    set_ = true;
  }
  bool WaitFor(absl::Duration d) {
    MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return set_; }, d);
  }

 private:
  Mutex mu_;
  bool set_ ABSL_GUARDED_BY(mu_) = false;
};

TEST(UpdateSchedulerTest, AStrandRunsItsTasksInOrderOneAtATime) {
  UpdateScheduler s(4);
  auto strand = s.NewStrand();
  std::atomic<int> running{0}, overlaps{0};
  std::vector<int> order;
  Mutex mu;
  Event done;
  for (int i = 0; i < 200; ++i) {
    strand->Schedule([&, i] {
      if (running.fetch_add(1) != 0) overlaps.fetch_add(1);
      {
        MutexLock lock(&mu);
        order.push_back(i);
      }
      running.fetch_sub(1);
      if (i == 199) done.Set();
    });
  }
  ASSERT_TRUE(done.WaitFor(absl::Seconds(30)));
  EXPECT_EQ(overlaps.load(), 0);
  MutexLock lock(&mu);
  ASSERT_EQ(order.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(order[i], i);
}

// A strand whose task does not finish (a large update) holds one driver;
// another strand's task still runs.
TEST(UpdateSchedulerTest, ABusyStrandDoesNotDelayAnother) {
  UpdateScheduler s(2);
  auto big = s.NewStrand(), small = s.NewStrand();
  Event release, small_ran, big_second;
  big->Schedule([&] { ASSERT_TRUE(release.WaitFor(absl::Seconds(60))); });
  big->Schedule([&] { big_second.Set(); });
  small->Schedule([&] { small_ran.Set(); });
  EXPECT_TRUE(small_ran.WaitFor(absl::Seconds(30)))
      << "the small strand waited for the busy one";
  release.Set();
  EXPECT_TRUE(big_second.WaitFor(absl::Seconds(30)));
}

TEST(UpdateSchedulerTest, TheDestructorRunsWhatWasScheduled) {
  std::atomic<int> ran{0};
  {
    UpdateScheduler s(2);
    auto a = s.NewStrand(), b = s.NewStrand();
    for (int i = 0; i < 50; ++i) {
      a->Schedule([&] { ran.fetch_add(1); });
      b->Schedule([&] { ran.fetch_add(1); });
    }
  }
  EXPECT_EQ(ran.load(), 100);
}

}  // namespace
}  // namespace zenflow
