#include "common/mutex.h"

#include <thread>

#include "gtest/gtest.h"

namespace zenflow {
namespace {

TEST(MutexTest, AwaitWakesWhenAnotherThreadChangesStateAndUnlocks) {
  Mutex mu;
  bool ready = false;
  std::thread t([&] {
    MutexLock lock(&mu);
    ready = true;
  });
  {
    MutexLock lock(&mu);
    mu.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return ready; });
    EXPECT_TRUE(ready);
  }
  t.join();
}

// A thread that changes state and then waits itself (without unlocking in
// between) must still wake the other waiter.
TEST(MutexTest, AwaitingAfterAChangeWakesOtherWaiters) {
  Mutex mu;
  bool a = false, b = false;
  std::thread waiter([&] {
    MutexLock lock(&mu);
    mu.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return a; });
    b = true;
  });
  {
    MutexLock lock(&mu);
    a = true;
    EXPECT_TRUE(mu.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return b; },
                                    absl::Seconds(30)));
  }
  waiter.join();
}

TEST(MutexTest, AwaitWithTimeoutReturnsFalseWhenTheConditionNeverHolds) {
  Mutex mu;
  MutexLock lock(&mu);
  EXPECT_FALSE(mu.AwaitWithTimeout([] { return false; }, absl::Milliseconds(20)));
}

}  // namespace
}  // namespace zenflow
