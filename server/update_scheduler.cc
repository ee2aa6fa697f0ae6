// Round-update strands over shared drivers; see update_scheduler.h.
#include "server/update_scheduler.h"

#include <pthread.h>

#include <algorithm>
#include <utility>

#include "common/thread_pool.h"

namespace zenflow {

void UpdateScheduler::Strand::Schedule(std::function<void()> task) {
  UpdateScheduler* s = owner_;
  MutexLock lock(&s->mu_);
  tasks_.push_back(std::move(task));
  ++s->pending_;
  if (!queued_or_running_) {
    queued_or_running_ = true;
    // The strand is owned by its job; the scheduler holds it while queued.
    s->ready_.push_back(shared_from_this());
  }
}

UpdateScheduler::UpdateScheduler(int drivers, int nice_delta) {
  for (int i = 0; i < std::max(1, drivers); ++i) {
    threads_.emplace_back([this, nice_delta] {
      (void)AdjustThreadNice(nice_delta);
      Loop();
    });
    // The update threads' CPU time is read apart from the rest of the
    // daemon's by name (./zf bench scale; docs/scale-benchmark.md).
    pthread_setname_np(threads_.back().native_handle(), kUpdateThreadName);
  }
}

UpdateScheduler::~UpdateScheduler() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void UpdateScheduler::Loop() {
  for (;;) {
    std::shared_ptr<Strand> strand;
    std::function<void()> task;
    {
      MutexLock lock(&mu_);
      mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !ready_.empty() || (stop_ && pending_ == 0); });
      if (ready_.empty()) return;  // stopping and drained
      strand = std::move(ready_.front());
      ready_.pop_front();
      task = std::move(strand->tasks_.front());
      strand->tasks_.pop_front();
    }
    task();
    MutexLock lock(&mu_);
    --pending_;
    if (strand->tasks_.empty()) {
      strand->queued_or_running_ = false;
    } else {
      ready_.push_back(std::move(strand));  // fair: behind the other ready strands
    }
  }
}

}  // namespace zenflow
