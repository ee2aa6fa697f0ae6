// Runs round updates: every job has its own Strand (its updates run one at a
// time, in order), and the strands share a fixed set of driver threads, so a
// job with a large update occupies one driver and never delays another job's
// round. The number of threads does not grow with the number of jobs.
//
//   UpdateScheduler scheduler(/*drivers=*/2);
//   std::shared_ptr<UpdateScheduler::Strand> strand = scheduler.NewStrand();
//   strand->Schedule([] { /* round r's update */ });
#ifndef ZENFLOW_SERVER_UPDATE_SCHEDULER_H_
#define ZENFLOW_SERVER_UPDATE_SCHEDULER_H_

#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"

namespace zenflow {

// The name (/proc/PID/task/TID/comm) of every thread that runs round
// updates: the scheduler's drivers and the update pool's threads. Nothing
// else runs on them, so their CPU time is the updates' (./zf bench scale).
inline constexpr char kUpdateThreadName[] = "zf-update";

// Thread-safe. The destructor runs the tasks already scheduled, then joins.
class UpdateScheduler {
 public:
  // Tasks of one strand run in order, never two at a time. Thread-safe.
  class Strand : public std::enable_shared_from_this<Strand> {
   public:
    void Schedule(std::function<void()> task);

   private:
    friend class UpdateScheduler;
    explicit Strand(UpdateScheduler* owner) : owner_(owner) {}
    UpdateScheduler* const owner_;
    // Guarded by owner_->mu_.
    std::deque<std::function<void()>> tasks_;
    bool queued_or_running_ = false;  // in ready_ or on a driver
  };

  // `drivers` threads, each adding `nice_delta` to its nice value as it
  // starts (AdjustThreadNice; a delta it may not apply is left out).
  explicit UpdateScheduler(int drivers, int nice_delta = 0);
  ~UpdateScheduler();
  UpdateScheduler(const UpdateScheduler&) = delete;
  UpdateScheduler& operator=(const UpdateScheduler&) = delete;

  std::shared_ptr<Strand> NewStrand() { return std::shared_ptr<Strand>(new Strand(this)); }
  int drivers() const { return static_cast<int>(threads_.size()); }

 private:
  void Loop();

  Mutex mu_;
  // Strands with a task to run, in the order they became ready; a driver
  // runs one task of the first, then puts it back at the end if it has more.
  std::deque<std::shared_ptr<Strand>> ready_ ABSL_GUARDED_BY(mu_);
  int64_t pending_ ABSL_GUARDED_BY(mu_) = 0;  // tasks scheduled, not yet run
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_UPDATE_SCHEDULER_H_
