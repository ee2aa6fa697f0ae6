// Backend memory that frees itself, growable: the worker's one owning buffer
// type, for either backend (the optimizer's state, and the parameters and
// gradients of the CPU and CUDA models alike).
//
//   DeviceBuffer buf;
//   ZF_RETURN_IF_ERROR(buf.Reserve(backend, bytes));
//   backend->ColumnImportance(grad, rows, cols, Importance::kL1, buf.f32());
#ifndef ZENFLOW_GPU_WORKER_DEVICE_BUFFER_H_
#define ZENFLOW_GPU_WORKER_DEVICE_BUFFER_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "gpu_worker/backend.h"

namespace zenflow::worker {

// Owns one backend allocation. Not thread-safe. Reserve() keeps the
// contents only when no reallocation is needed.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() {
    if (p_ != nullptr) be_->Free(p_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  absl::Status Reserve(Backend* backend, size_t bytes) {
    bytes = std::max<size_t>(bytes, 64);
    if (p_ != nullptr && bytes <= bytes_ && backend == be_) return absl::OkStatus();
    if (p_ != nullptr) be_->Free(p_);
    p_ = nullptr;
    be_ = backend;
    ZF_ASSIGN_OR_RETURN(p_, be_->Alloc(bytes));
    bytes_ = bytes;
    return absl::OkStatus();
  }
  void* p() const { return p_; }
  float* f32() const { return static_cast<float*>(p_); }
  int32_t* i32() const { return static_cast<int32_t*>(p_); }
  int64_t* i64() const { return static_cast<int64_t*>(p_); }
  size_t bytes() const { return bytes_; }

 private:
  Backend* be_ = nullptr;
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace zenflow::worker

#endif  // ZENFLOW_GPU_WORKER_DEVICE_BUFFER_H_
