// Process-wide allocator settings for the binaries that move bulk buffers
// (zenflowd, the trainer, the benchmarks). Shards and deltas are 4 MiB
// buffers allocated and freed thousands of times a second; with glibc's
// defaults each one is a fresh mmap whose pages fault in on first touch
// (expensive, and more so inside a VM). Keeping them in the heap makes
// their reuse free.
#ifndef ZENFLOW_COMMON_MALLOC_TUNING_H_
#define ZENFLOW_COMMON_MALLOC_TUNING_H_

#include <malloc.h>

namespace zenflow {

// Call once at the start of main(). Returns false if glibc refused.
inline bool TuneMallocForBulkBuffers() {
  // 32 MiB is the largest mmap threshold glibc accepts on 64-bit.
  const bool a = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;
  // Do not hand freed heap memory back to the kernel below 1 GiB.
  const bool b = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
  // One arena: per-thread arenas live in 64 MiB heaps that glibc unmaps
  // whenever one empties, whatever the trim threshold, so buffers freed by
  // one round fault in again in the next. Allocation of bulk buffers is
  // rare enough (hundreds per second) that one lock costs nothing.
  const bool c = mallopt(M_ARENA_MAX, 1) == 1;
  return a && b && c;
}

}  // namespace zenflow

#endif  // ZENFLOW_COMMON_MALLOC_TUNING_H_
