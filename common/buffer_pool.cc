#include "common/buffer_pool.h"

#include <utility>

namespace zenflow {

std::string BufferPool::Take(size_t n) {
  std::string b;
  if (n >= kMinBytes) {
    MutexLock lock(&mu_);
    size_t best = pool_.size();
    for (size_t i = 0; i < pool_.size(); ++i) {
      const size_t cap = pool_[i].capacity();
      if (cap >= n && cap <= 2 * n + (size_t{1} << 20) &&
          (best == pool_.size() || cap < pool_[best].capacity())) {
        best = i;
      }
    }
    if (best < pool_.size()) {
      b = std::move(pool_[best]);
      pool_[best] = std::move(pool_.back());
      pool_.pop_back();
      bytes_ -= b.capacity();
    }
  }
  if (b.capacity() < n) b.reserve((n + (n >> 6) + 4095) & ~size_t{4095});
  b.resize(n);  // fills only beyond the buffer's old size
  return b;
}

void BufferPool::Give(std::string buffer) {
  if (buffer.capacity() < kMinBytes) return;
  MutexLock lock(&mu_);
  if (pool_.size() >= kMaxBuffers || bytes_ + buffer.capacity() > kMaxBytes) return;
  bytes_ += buffer.capacity();
  pool_.push_back(std::move(buffer));
}

}  // namespace zenflow
