// A single background thread that runs tasks one at a time, in submission
// order. The daemon runs round updates on it so that a job's rounds are
// updated strictly in order.
//
//   SerialExecutor ex;
//   ex.Schedule([] { ... });
#ifndef ZENFLOW_SERVER_SERIAL_EXECUTOR_H_
#define ZENFLOW_SERVER_SERIAL_EXECUTOR_H_

#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"

namespace zenflow {

// Thread-safe. The destructor runs the tasks already queued, then joins.
class SerialExecutor {
 public:
  SerialExecutor();
  ~SerialExecutor();
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  void Schedule(std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop();

  Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_SERIAL_EXECUTOR_H_
