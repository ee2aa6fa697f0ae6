// Stand-in for transformer_cuda.cu when the build has no CUDA toolkit: the
// same API, and every entry point that would need a device says so.
#include <string>

#include "gpu_worker/model/transformer_cuda.h"

namespace zenflow {
namespace model {
namespace {

absl::Status NotCompiled(const char* what) {
  return absl::UnavailableError(
      std::string(what) +
      ": this binary was built without CUDA (nvcc was not found when it was "
      "built); use the CPU Transformer or rebuild with the CUDA toolkit");
}

}  // namespace

bool CudaModelCompiled() { return false; }

struct CudaTransformer::Impl {};

absl::StatusOr<std::unique_ptr<CudaTransformer>> CudaTransformer::Create(
    const ModelConfig& cfg, int device) {
  if (absl::Status s = cfg.Validate(); !s.ok()) return s;
  return NotCompiled("CudaTransformer::Create");
}

CudaTransformer::CudaTransformer(const ModelConfig& cfg, int device)
    : cfg_(cfg), device_(device), last_loss_(0.0) {}

CudaTransformer::~CudaTransformer() = default;

absl::StatusOr<float> CudaTransformer::Forward(const float* d_params,
                                               const uint8_t* host_tokens,
                                               int batch, int seq) {
  return NotCompiled("CudaTransformer::Forward");
}

absl::Status CudaTransformer::Backward(const float* d_params, float* d_grads) {
  return NotCompiled("CudaTransformer::Backward");
}

}  // namespace model
}  // namespace zenflow
