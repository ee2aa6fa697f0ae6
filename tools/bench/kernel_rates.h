// The daemon's kernels measured alone, in the bench's own process, as the
// ceilings the benches quote the daemon against (docs/scale-benchmark.md,
// "Ingest and round update against their kernels"):
//   - the shard accumulate kernel (DecodeAdd of the wire dtype into fp32)
//     on ONE thread, in wire bytes per CPU second of that thread;
//   - a round update's kernels (AdamW over the round's values, then their
//     delta encode: values in the tensors' dtype, plus bf16 m and v when the
//     deltas carry moments) on a ThreadPool of the daemon's update threads,
//     in seconds per round (median of several).
//
//   const double a = AccumulateBytesPerCpuSecond(DType::kBF16, int64_t{1} << 23);
//   ThreadPool pool(2);
//   const double s = RoundUpdateKernelSeconds({values, DType::kF32, false}, &pool, 7);
#ifndef ZENFLOW_TOOLS_BENCH_KERNEL_RATES_H_
#define ZENFLOW_TOOLS_BENCH_KERNEL_RATES_H_

#include <cstdint>
#include <string>

#include "common/codec.h"
#include "common/thread_pool.h"

namespace zenflow {

// Wire bytes DecodeAdd-ed into fp32 per CPU second of the calling thread:
// `values` values into one fp32 buffer (the size of the round's sums it
// stands for), one warm-up pass, then samples of at least 16 MiB of passes
// until at least `min_cpu_s`; the median sample.
double AccumulateBytesPerCpuSecond(DType wire, int64_t values, double min_cpu_s = 0.3);

// The same while a second thread copies `copy_bytes` at a time (4 MiB
// pieces of a buffer of that size, over and over): the receive copy that a
// UCX progress thread does beside the daemon's accumulate, on a host whose
// memory bandwidth the two share. Only the accumulating thread's CPU time
// is counted.
double AccumulateBytesPerCpuSecondBesideCopy(DType wire, int64_t values, int64_t copy_bytes,
                                             double min_cpu_s = 0.3);

// What one round update of the daemon computes, as far as its kernels go.
struct RoundKernelJob {
  int64_t values = 0;              // the daemon-hosted values the round updates
  DType value_dtype = DType::kF32; // of the value deltas (the tensors' dtype)
  bool moments = false;            // the deltas also carry bf16 m and v
  std::string Describe() const;
};

// Median wall seconds over `reps` rounds (after one warm-up round) of the
// update's kernels for `job` on `pool` (the calling thread is one of its
// threads): AdamWUpdate at the host's best SIMD level over the values, then
// Encode of the new values (and m, v) into delta buffers. No fold, norm,
// clear, framing or scheduling: the kernels alone. With cpu_s, also the
// median CPU seconds this process spent per round (getrusage: every
// thread of the pool, so the work a round's kernels cost, apart from how
// many cores they had).
double RoundUpdateKernelSeconds(const RoundKernelJob& job, ThreadPool* pool, int reps,
                                double* cpu_s = nullptr);

}  // namespace zenflow

#endif  // ZENFLOW_TOOLS_BENCH_KERNEL_RATES_H_
