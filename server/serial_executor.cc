// Serial background executor; see serial_executor.h.
#include "server/serial_executor.h"

#include <utility>

namespace zenflow {

SerialExecutor::SerialExecutor() : thread_([this] { Loop(); }) {}

SerialExecutor::~SerialExecutor() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void SerialExecutor::Schedule(std::function<void()> task) {
  MutexLock lock(&mu_);
  tasks_.push_back(std::move(task));
}

void SerialExecutor::Loop() {
  for (;;) {
    std::function<void()> task;
    {
      MutexLock lock(&mu_);
      mu_.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return stop_ || !tasks_.empty();
          });
      if (tasks_.empty()) return;  // stop_ and drained
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace zenflow
