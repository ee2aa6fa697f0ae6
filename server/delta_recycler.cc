// Delta message buffers kept for the next round; see delta_recycler.h.
#include "server/delta_recycler.h"

#include <algorithm>
#include <utility>

namespace zenflow {

std::string DeltaRecycler::Take(size_t n) {
  if (n < kMinBytes) return std::string();
  MutexLock lock(&mu_);
  size_t best = spares_.size();
  for (size_t i = 0; i < spares_.size(); ++i) {
    const size_t cap = spares_[i].capacity();
    if (cap < n || cap / 2 > n) continue;
    if (best == spares_.size() || cap < spares_[best].capacity()) best = i;
  }
  if (best == spares_.size()) {
    ++missed_;
    return std::string();
  }
  std::string out = std::move(spares_[best]);
  if (best + 1 != spares_.size()) spares_[best] = std::move(spares_.back());
  spares_.pop_back();
  const int64_t cap = static_cast<int64_t>(out.capacity());
  spare_bytes_ -= cap;
  held_bytes_ += cap;
  ++taken_;
  return out;
}

void DeltaRecycler::Hold(int64_t bytes) {
  MutexLock lock(&mu_);
  held_bytes_ += bytes;
}

void DeltaRecycler::Release(int64_t bytes) {
  MutexLock lock(&mu_);
  held_bytes_ = std::max<int64_t>(0, held_bytes_ - bytes);
}

void DeltaRecycler::Keep(std::string *s) {
  const int64_t cap = static_cast<int64_t>(s->capacity());
  if (s->capacity() < kMinBytes || spare_bytes_ + held_bytes_ + cap > limit_) return;
  spare_bytes_ += cap;
  spares_.push_back(std::move(*s));
}

void DeltaRecycler::Recycle(v1::DownMessage *d) {
  if (!d->has_delta()) return;
  v1::ParameterDelta *x = d->mutable_delta();
  std::string payload = std::move(*x->mutable_payload());
  std::string m = std::move(*x->mutable_m());
  std::string v = std::move(*x->mutable_v());
  // What is not kept is freed when these go out of scope, after the lock.
  MutexLock lock(&mu_);
  Keep(&payload);
  Keep(&m);
  Keep(&v);
}

DeltaRecycler::Stats DeltaRecycler::stats() const {
  MutexLock lock(&mu_);
  return Stats{taken_, missed_, spare_bytes_, held_bytes_};
}

}  // namespace zenflow
