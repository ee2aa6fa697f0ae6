// Recycled receive buffers: a transport's receive path takes a buffer of a
// message's size from here and its reader gives it back once done, so that
// a steady stream of messages allocates, faults in and zero-fills no new
// memory per message (UcxWorker: UcxWorker::Recycle gives back). Bounded in
// buffers and bytes; thread-safe.
//
//   BufferPool pool;
//   std::string b = pool.Take(n);   // exactly n bytes, contents unspecified
//   ... receive into b, hand it on; later:
//   pool.Give(std::move(b));
#ifndef ZENFLOW_COMMON_BUFFER_POOL_H_
#define ZENFLOW_COMMON_BUFFER_POOL_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"

namespace zenflow {

class BufferPool {
 public:
  static constexpr size_t kMaxBuffers = 128;
  static constexpr size_t kMaxBytes = size_t{1} << 30;
  // Buffers shorter than this are neither taken from nor kept in the pool
  // (a round close would otherwise carry off a shard's buffer, which its
  // reader does not give back, and the next shard would fault in a new one).
  static constexpr size_t kMinBytes = 4096;

  BufferPool() { pool_.reserve(kMaxBuffers); }

  // A buffer of exactly n bytes (contents unspecified): the smallest pooled
  // one that fits and is not much larger, else a new one with a little room
  // to spare (frames of one kind differ by a few header bytes).
  std::string Take(size_t n);
  // Keeps `buffer` for a later Take, unless it is small or the pool full.
  void Give(std::string buffer);

 private:
  Mutex mu_;
  std::vector<std::string> pool_ ABSL_GUARDED_BY(mu_);
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace zenflow

#endif  // ZENFLOW_COMMON_BUFFER_POOL_H_
