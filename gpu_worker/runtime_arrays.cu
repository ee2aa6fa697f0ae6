// RuntimeArrays over the CUDA runtime; see runtime_arrays.h.
#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/status_macros.h"
#include "gpu_worker/cuda_util.h"
#include "gpu_worker/runtime_arrays.h"

namespace zenflow::worker {
namespace {

constexpr char kWho[] = "zf_cuda_path_check";

class CudaRuntimeArrays final : public RuntimeArrays {
 public:
  explicit CudaRuntimeArrays(int device) : device_(device) {}
  ~CudaRuntimeArrays() override {
    if (cudaSetDevice(device_) != cudaSuccess) return;
    if (stream_.get() != nullptr) cudaStreamSynchronize(stream_.get());
    for (void* p : device_mem_) cudaFree(p);
    for (void* p : host_mem_) cudaFreeHost(p);
  }
  absl::Status Init() {
    ZF_RETURN_IF_ERROR(CudaStatus(kWho, cudaSetDevice(device_), "cudaSetDevice"));
    return stream_.Create(kWho, cudaStreamNonBlocking);
  }
  uintptr_t stream() const override { return reinterpret_cast<uintptr_t>(stream_.get()); }
  absl::StatusOr<void*> Malloc(size_t bytes) override {
    void* p = nullptr;
    ZF_RETURN_IF_ERROR(CudaStatus(kWho, cudaMalloc(&p, bytes), "cudaMalloc"));
    device_mem_.push_back(p);
    return p;
  }
  absl::StatusOr<void*> MallocHost(size_t bytes) override {
    void* p = nullptr;
    ZF_RETURN_IF_ERROR(CudaStatus(kWho, cudaMallocHost(&p, bytes), "cudaMallocHost"));
    host_mem_.push_back(p);
    return p;
  }
  absl::Status CopyAsync(void* dst, const void* src, size_t bytes) override {
    return CudaStatus(kWho, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_.get()),
                      "cudaMemcpyAsync");
  }
  absl::Status Synchronize() override {
    return CudaStatus(kWho, cudaStreamSynchronize(stream_.get()), "cudaStreamSynchronize");
  }

 private:
  const int device_;
  CudaStream stream_;
  std::vector<void*> device_mem_, host_mem_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RuntimeArrays>> RuntimeArrays::Create(int device) {
  if (VisibleCudaDevices() == 0) return absl::UnavailableError("no CUDA device is visible");
  auto a = std::make_unique<CudaRuntimeArrays>(device);
  ZF_RETURN_IF_ERROR(a->Init());
  return std::unique_ptr<RuntimeArrays>(std::move(a));
}

}  // namespace zenflow::worker
