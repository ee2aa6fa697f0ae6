// CUDA runtime plumbing shared by the worker's nvcc-compiled code (the
// backend, kernels/cuda_backend.cu, and the model, model/transformer_cuda.cu):
// cudaError_t -> absl::Status, the check after a kernel launch, the visible
// device count and an owned stream. Needs the CUDA runtime headers, so only
// .cu files include it.
//
// Messages name their caller (`who`, e.g. "CUDA backend") so that an error
// says which component failed.
#ifndef ZENFLOW_GPU_WORKER_CUDA_UTIL_H_
#define ZENFLOW_GPU_WORKER_CUDA_UTIL_H_

#include <cuda_runtime.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace zenflow::worker {

// OK for cudaSuccess; otherwise "<who>: <what> failed: <name> (<text>)",
// RESOURCE_EXHAUSTED for a failed allocation and INTERNAL for the rest.
inline absl::Status CudaStatus(absl::string_view who, cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  const std::string msg = absl::StrCat(who, ": ", what, " failed: ", cudaGetErrorName(err), " (",
                                       cudaGetErrorString(err), ")");
  if (err == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

// Checks the launch that was just made (bad configuration, sticky errors).
inline absl::Status CheckLaunch(absl::string_view who, absl::string_view kernel) {
  return CudaStatus(who, cudaGetLastError(), absl::StrCat("launch of ", kernel));
}

// Number of CUDA devices visible; 0 when the query fails (no driver, no
// device), whose error is cleared so that it does not stick.
inline int VisibleCudaDevices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

// Owns one stream. The device that was current at Create must be current
// when the stream is reset or destroyed. Not thread-safe.
class CudaStream {
 public:
  CudaStream() = default;
  ~CudaStream() { Reset(); }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  // Creates the stream on the current device; `flags` as for
  // cudaStreamCreateWithFlags (cudaStreamDefault: ordered with the legacy
  // default stream; cudaStreamNonBlocking: not).
  absl::Status Create(absl::string_view who, unsigned int flags) {
    Reset();
    const cudaError_t err = cudaStreamCreateWithFlags(&stream_, flags);
    if (err != cudaSuccess) stream_ = nullptr;  // Nothing to destroy.
    return CudaStatus(who, err, "cudaStreamCreateWithFlags");
  }

  // Null before a successful Create.
  cudaStream_t get() const { return stream_; }

  // Waits for the stream's work, then destroys it.
  void Reset() {
    if (stream_ == nullptr) return;
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace zenflow::worker

#endif  // ZENFLOW_GPU_WORKER_CUDA_UTIL_H_
