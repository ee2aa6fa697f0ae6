// The CPU backend's PackColumns: the worker's hot gather of a step's
// unimportant columns into packed shards (see cpu_pack.cc). Not an API: the
// Backend (cpu_backend.cc) checks the arguments and calls it.
#ifndef ZENFLOW_GPU_WORKER_KERNELS_CPU_PACK_H_
#define ZENFLOW_GPU_WORKER_KERNELS_CPU_PACK_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/thread_pool.h"
#include "gpu_worker/backend.h"

namespace zenflow::worker::cpu {

// Backend::PackColumns on host memory, over `pool`'s threads, with the
// AVX-512 kernels where `simd` allows them and the CPU has them. The
// arguments are checked already and ncols > 0.
absl::Status PackColumns(ThreadPool& pool, bool simd, const float* w, int64_t rows, int64_t cols,
                         const int32_t* columns, int64_t ncols, PackDType dtype, void* dst,
                         float* scales);

}  // namespace zenflow::worker::cpu

#endif  // ZENFLOW_GPU_WORKER_KERNELS_CPU_PACK_H_
