// Device memory and a stream from the CUDA runtime, owned as a framework
// (torch, CuPy) owns its own: what zf_cuda_path_check hands the engine as
// "the caller's" arrays and stream. Compiled by nvcc (runtime_arrays.cu)
// or, without CUDA, a stub whose Create answers UNAVAILABLE.
#ifndef ZENFLOW_GPU_WORKER_RUNTIME_ARRAYS_H_
#define ZENFLOW_GPU_WORKER_RUNTIME_ARRAYS_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace zenflow::worker {

// Frees everything it allocated, after its stream's work, when destroyed.
class RuntimeArrays {
 public:
  // A non-blocking stream on `device`.
  static absl::StatusOr<std::unique_ptr<RuntimeArrays>> Create(int device);
  virtual ~RuntimeArrays() = default;
  // The stream as the integer __cuda_array_interface__ uses.
  virtual uintptr_t stream() const = 0;
  virtual absl::StatusOr<void*> Malloc(size_t bytes) = 0;      // device memory
  virtual absl::StatusOr<void*> MallocHost(size_t bytes) = 0;  // pinned host memory
  // An asynchronous copy on the stream (either direction).
  virtual absl::Status CopyAsync(void* dst, const void* src, size_t bytes) = 0;
  // Waits for the stream.
  virtual absl::Status Synchronize() = 0;
};

}  // namespace zenflow::worker

#endif  // ZENFLOW_GPU_WORKER_RUNTIME_ARRAYS_H_
