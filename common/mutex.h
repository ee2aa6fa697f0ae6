// A mutex with absl::Mutex-style Await, built on std::mutex and
// std::condition_variable. Debian's Abseil is not built with
// ThreadSanitizer, so absl::Mutex's synchronization is invisible to it;
// std::mutex goes through pthreads, which ThreadSanitizer intercepts. With
// this, `./zf test --tsan` checks our code for real races.
//
//   Mutex mu;
//   MutexLock lock(&mu);
//   mu.Await([&] { return ready; });   // re-checked whenever mu is released
//
// The condition runs with mu held, but clang's thread-safety analysis
// (./zf lint) sees a lambda as a function of its own that holds nothing: a
// condition that reads fields GUARDED_BY(mu) first calls a no-op member
// annotated ABSL_ASSERT_EXCLUSIVE_LOCK(mu) (e.g. Job::AwaitHoldsMu).
#ifndef ZENFLOW_COMMON_MUTEX_H_
#define ZENFLOW_COMMON_MUTEX_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"

namespace zenflow {

// Thread-safe. Await(pred) blocks until pred() is true; pred runs with the
// mutex held and is re-evaluated each time another thread releases it
// (Unlock, or starting to wait in Await).
class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    // Notify before unlocking: once unlocked, a woken waiter may return and
    // destroy this Mutex (as absl::Mutex allows), so the condition variable
    // must not be touched after that.
    if (waiters_ > 0) cv_.notify_all();
    mu_.unlock();
  }

  template <typename Pred>
  void Await(Pred pred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    std::unique_lock<std::mutex> l(mu_, std::adopt_lock);
    // Waiting releases the mutex: others must re-check what we changed.
    if (waiters_ > 0) cv_.notify_all();
    ++waiters_;
    while (!pred()) cv_.wait(l);
    --waiters_;
    l.release();
  }

  // Returns pred()'s final value (false on timeout).
  template <typename Pred>
  bool AwaitWithTimeout(Pred pred, absl::Duration timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
    std::unique_lock<std::mutex> l(mu_, std::adopt_lock);
    if (waiters_ > 0) cv_.notify_all();
    ++waiters_;
    bool ok = pred();
    while (!ok) {
      if (cv_.wait_until(l, deadline) == std::cv_status::timeout) {
        ok = pred();
        break;
      }
      ok = pred();
    }
    --waiters_;
    l.release();
    return ok;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int waiters_ = 0;  // guarded by mu_
};

// RAII lock of a Mutex.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

}  // namespace zenflow

#endif  // ZENFLOW_COMMON_MUTEX_H_
