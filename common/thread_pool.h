// A small fixed-size thread pool offering a statically partitioned
// ParallelFor and a dynamically claimed ForEach, used to spread optimizer
// and codec work over CPU cores.

#ifndef ZENFLOW_COMMON_THREAD_POOL_H_
#define ZENFLOW_COMMON_THREAD_POOL_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"

namespace zenflow {

// Fixed-size pool of `num_threads` participants: num_threads - 1 background
// threads plus the thread that calls ParallelFor.
//
// Thread-safe: ParallelFor may be called concurrently from several threads;
// such calls are serialized. ParallelFor must not be called from inside a
// ParallelFor callback of the same pool (it would deadlock).
// Adds `delta` to the calling thread's nice value (Linux keeps one per
// thread; new threads inherit their creator's), clamped to [-20, 19]. A
// negative delta needs CAP_SYS_NICE (or RLIMIT_NICE room): without it,
// PERMISSION_DENIED and the value is unchanged.
absl::Status AdjustThreadNice(int delta);

class ThreadPool {
 public:
  // num_threads >= 1 (smaller values are treated as 1). ThreadPool(1) starts
  // no threads and runs everything inline on the caller. A non-empty `name`
  // (at most 15 characters) names the background threads, as `top -H` and
  // /proc/PID/task/TID/comm show them.
  // `nice_delta` is added to each background thread's nice value as it
  // starts (AdjustThreadNice; a delta it may not apply is left out).
  explicit ThreadPool(int num_threads, const char* name = "", int nice_delta = 0);

  // Joins all background threads. No ParallelFor may be in progress.
  ~ThreadPool();

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Total participants, including the calling thread.
  int num_threads() const { return num_threads_; }

  // Splits [0, n) into k = min(num_threads(), max(1, n / grain)) contiguous
  // chunks of near-equal size (each at least `grain` items unless n < grain;
  // grain 0 is treated as 1). Chunk i is [i*n/k, (i+1)*n/k) up to rounding,
  // so the partition depends only on (n, grain, num_threads()). Chunk 0 runs
  // on the caller, chunk i on background thread i. Calls fn(begin, end) once
  // per chunk and returns when all chunks are done; does nothing if n == 0.
  // If fn throws, the first exception is rethrown here after all chunks end.
  void ParallelFor(size_t n, size_t grain,
                   const std::function<void(size_t, size_t)>& fn);

  // Calls fn(i) once for every i in [0, n): each participant (up to
  // num_threads(), the caller among them) claims the next unclaimed index
  // from a shared counter until none is left, so tasks of uneven size keep
  // every thread busy until the last one (what ParallelFor's fixed chunks
  // do not). Which thread runs which index is not fixed: fn must write
  // only what index i owns. Returns when all are done; if fn throws, every
  // other index still runs and the first exception is rethrown here.
  void ForEach(size_t n, const std::function<void(size_t)>& fn);

 private:
  void WorkerLoop(int index);

  // Runs chunk `index` of the current job and records any exception.
  void RunChunk(size_t index, size_t n, size_t chunks,
                const std::function<void(size_t, size_t)>& fn);

  const int num_threads_;
  std::vector<std::thread> workers_;

  // Serializes concurrent ParallelFor calls.
  std::mutex call_mu_;

  // Guards the job state below.
  std::mutex mu_;
  std::condition_variable work_cv_;  // Workers wait for a new generation.
  std::condition_variable done_cv_;  // The caller waits for pending_ == 0.
  bool shutdown_ = false;
  uint64_t generation_ = 0;
  const std::function<void(size_t, size_t)>* fn_ = nullptr;
  size_t n_ = 0;
  size_t chunks_ = 0;
  size_t pending_ = 0;  // Background chunks not yet finished.
  std::exception_ptr error_;
};

}  // namespace zenflow

#endif  // ZENFLOW_COMMON_THREAD_POOL_H_
