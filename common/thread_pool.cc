// Fixed-size thread pool with a statically partitioned ParallelFor.
// See thread_pool.h.

#include "common/thread_pool.h"

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace zenflow {
namespace {

// Bounds of chunk `index` when [0, n) is split into `chunks` near-equal
// contiguous pieces (the first n % chunks pieces get one extra item).
void ChunkBounds(size_t n, size_t chunks, size_t index, size_t* begin,
                 size_t* end) {
  const size_t base = n / chunks;
  const size_t extra = n % chunks;
  *begin = index * base + std::min(index, extra);
  *end = *begin + base + (index < extra ? 1 : 0);
}

}  // namespace

absl::Status AdjustThreadNice(int delta) {
  if (delta == 0) return absl::OkStatus();
  const id_t tid = static_cast<id_t>(syscall(SYS_gettid));
  errno = 0;
  const int now = getpriority(PRIO_PROCESS, tid);
  if (now == -1 && errno != 0) {
    return absl::InternalError(absl::StrCat("getpriority: ", std::strerror(errno)));
  }
  const int want = std::min(19, std::max(-20, now + delta));
  if (setpriority(PRIO_PROCESS, tid, want) != 0) {
    const int e = errno;
    const std::string why = absl::StrCat("setpriority(", want, ") of thread ", tid, ": ",
                                         std::strerror(e));
    return e == EACCES || e == EPERM ? absl::PermissionDeniedError(why)
                                     : absl::InternalError(why);
  }
  return absl::OkStatus();
}

ThreadPool::ThreadPool(int num_threads, const char* name, int nice_delta)
    : num_threads_(std::max(1, num_threads)) {
  workers_.reserve(num_threads_ - 1);
  for (int i = 1; i < num_threads_; ++i) {
    workers_.emplace_back([this, i, nice_delta] {
      (void)AdjustThreadNice(nice_delta);
      WorkerLoop(i);
    });
    if (name != nullptr && name[0] != '\0') {
      pthread_setname_np(workers_.back().native_handle(), name);
    }
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::RunChunk(size_t index, size_t n, size_t chunks,
                          const std::function<void(size_t, size_t)>& fn) {
  size_t begin, end;
  ChunkBounds(n, chunks, index, &begin, &end);
  try {
    fn(begin, end);
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_) error_ = std::current_exception();
  }
}

void ThreadPool::ParallelFor(size_t n, size_t grain,
                             const std::function<void(size_t, size_t)>& fn) {
  if (n == 0) return;
  if (grain == 0) grain = 1;
  const size_t chunks = std::max<size_t>(
      1, std::min<size_t>(static_cast<size_t>(num_threads_), n / grain));
  if (chunks == 1) {
    fn(0, n);
    return;
  }

  std::lock_guard<std::mutex> call_lock(call_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    chunks_ = chunks;
    pending_ = chunks - 1;
    error_ = nullptr;
    ++generation_;
  }
  work_cv_.notify_all();

  RunChunk(0, n, chunks, fn);

  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return pending_ == 0; });
    fn_ = nullptr;
    error = error_;
    error_ = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

void ThreadPool::ForEach(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  std::atomic<size_t> next{0};
  std::mutex error_mu;
  std::exception_ptr error;
  const size_t participants = std::min<size_t>(static_cast<size_t>(num_threads_), n);
  ParallelFor(participants, 1, [&](size_t, size_t) {
    for (size_t i = next.fetch_add(1, std::memory_order_relaxed); i < n;
         i = next.fetch_add(1, std::memory_order_relaxed)) {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (!error) error = std::current_exception();
      }
    }
  });
  if (error) std::rethrow_exception(error);
}

void ThreadPool::WorkerLoop(int index) {
  const size_t chunk = static_cast<size_t>(index);
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    work_cv_.wait(lock, [&] { return shutdown_ || generation_ != seen; });
    if (shutdown_) return;
    seen = generation_;
    if (chunk >= chunks_) continue;  // Not needed for this job.
    const std::function<void(size_t, size_t)>* fn = fn_;
    const size_t n = n_;
    const size_t chunks = chunks_;
    lock.unlock();
    RunChunk(chunk, n, chunks, *fn);
    lock.lock();
    if (--pending_ == 0) done_cv_.notify_one();
  }
}

}  // namespace zenflow
