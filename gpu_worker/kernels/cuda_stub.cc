// CUDA entry points for builds without nvcc: the CUDA backend is
// unavailable and no device is ever reported.
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu_worker/backend.h"

namespace zenflow::worker {

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device) {
  return absl::UnavailableError(
      "built without CUDA: nvcc was not found when this binary was built (install the CUDA "
      "toolkit or set CUDA_HOME, then rebuild), so use the CPU backend");
}

bool CudaCompiled() { return false; }

int CudaDeviceCount() { return 0; }

absl::StatusOr<int> CudaPointerDevice(const void* p) {
  return absl::UnavailableError(
      "built without CUDA: nvcc was not found when this binary was built, so device memory "
      "cannot be used (rebuild with the CUDA toolkit, or keep the tensors in host memory)");
}

}  // namespace zenflow::worker
