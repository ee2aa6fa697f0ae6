// The buffers of a job's delta messages, kept from one round's messages for
// the next round's (docs/architecture.md#the-data-path).
//
// A round update sizes every delta message's payload (and m, v) before it
// encodes into it. A fresh std::string is zero-filled by resize() (and, on a
// buffer new to the process, its pages fault in), which cost the update about
// as much as AdamW itself
// (docs/scale-benchmark.md#where-the-time-goes-the-round-update). The ranks'
// outboxes give each message's buffers back here once every rank has it
// (Recycle, from the message's deleter); the next update takes them (Take): a
// buffer that already held as many bytes is resized without a write, and its
// pages are the process's already. Every byte of a taken buffer is overwritten
// by the update's encode.
//
// Bounded: the spares and the buffers the update holds (Hold, Release)
// together stay within the job's charged delta reserve (JobFootprint
// .delta_bytes, docs/operating.md#memory-of-a-job), so nothing kept here
// is memory the job was not charged for. Buffers below kMinBytes are not
// kept (their zero-fill is cheap).
//
// Thread-safe: the update's threads take, the transports' threads recycle.
#ifndef ZENFLOW_SERVER_DELTA_RECYCLER_H_
#define ZENFLOW_SERVER_DELTA_RECYCLER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

class DeltaRecycler {
 public:
  static constexpr size_t kMinBytes = size_t{64} << 10;

  explicit DeltaRecycler(int64_t limit_bytes) : limit_(limit_bytes) {}
  DeltaRecycler(const DeltaRecycler &) = delete;
  DeltaRecycler &operator=(const DeltaRecycler &) = delete;

  // A buffer for n bytes: the spare of least capacity in [n, 2n] (its
  // size is what it held last, its bytes stale: the caller resizes it and
  // overwrites all n), or an empty string when none fits. A taken spare's
  // capacity counts as held by the update until Release.
  std::string Take(size_t n);
  // Bytes of buffers the update made or took, until it hands them on.
  void Hold(int64_t bytes);
  void Release(int64_t bytes);
  // The buffers of a delta message no rank needs any more (its payload, m
  // and v): kept while the spares and the held bytes stay within the limit.
  void Recycle(v1::DownMessage *d);

  struct Stats {
    int64_t taken = 0;   // Takes served by a spare
    int64_t missed = 0;  // Takes of kMinBytes or more with no spare that fit
    int64_t spare_bytes = 0;
    int64_t held_bytes = 0;
  };
  Stats stats() const;

 private:
  // Moves *s into the spares when it is kept.
  void Keep(std::string *s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t limit_;
  mutable Mutex mu_;
  std::vector<std::string> spares_ ABSL_GUARDED_BY(mu_);
  int64_t spare_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t taken_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t missed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_DELTA_RECYCLER_H_
