// CUDA version of the reference transformer LM (transformer.h): the same
// architecture, parameter layout (BuildTensorLayout) and loss, with the
// parameters and gradients in DEVICE memory.
//
// Matrix products go through cuBLAS (fp32, no TF32); embeddings, LayerNorm,
// the causal softmax, GELU and the cross-entropy are custom kernels. All work
// is enqueued on one stream owned by the model, a blocking stream (ordered
// with the legacy default stream; writers of the parameters on non-blocking
// streams must synchronize first). Forward waits for the loss, Backward for
// the gradients, so both report asynchronous CUDA errors.
// Results match the CPU model to fp32 rounding (summation orders differ), not
// bit for bit.
//
// Compiled by nvcc when the toolkit is present (transformer_cuda.cu);
// otherwise transformer_cuda_stub.cc provides the same API and Create returns
// UNAVAILABLE.
//
// The parameter and gradient buffers are ordinary worker device memory (a
// DeviceBuffer of a CUDA Backend, gpu_worker/device_buffer.h), which the
// optimizer then updates in place. The backend's stream is non-blocking, so
// synchronize it before handing the model what it wrote:
//
//   ZF_ASSIGN_OR_RETURN(auto backend, worker::MakeCudaBackend(0));
//   ZF_ASSIGN_OR_RETURN(auto model, CudaTransformer::Create(cfg, 0));
//   const size_t bytes = model->num_params() * sizeof(float);
//   worker::DeviceBuffer params, grads;
//   ZF_RETURN_IF_ERROR(params.Reserve(backend.get(), bytes));
//   ZF_RETURN_IF_ERROR(grads.Reserve(backend.get(), bytes));
//   ZF_RETURN_IF_ERROR(backend->CopyToDevice(params.p(), host_params, bytes));
//   ZF_RETURN_IF_ERROR(backend->Synchronize());
//   ZF_ASSIGN_OR_RETURN(float loss, model->Forward(params.f32(), tokens,
//                                                  batch, seq));
//   ZF_RETURN_IF_ERROR(model->Backward(params.f32(), grads.f32()));

#ifndef ZENFLOW_GPU_WORKER_MODEL_TRANSFORMER_CUDA_H_
#define ZENFLOW_GPU_WORKER_MODEL_TRANSFORMER_CUDA_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu_worker/model/transformer.h"

namespace zenflow {
namespace model {

// True when this binary was built with the CUDA implementation (nvcc).
bool CudaModelCompiled();

// The model on one CUDA device. The parameters are NOT owned: callers pass a
// device buffer of num_params() floats to each call.
//
// Thread-compatible: the object owns the device workspace of the last
// Forward (allocated once per (batch, seq) and reused while they stay the
// same), so calls on one instance must be serialized.
class CudaTransformer {
 public:
  // Validates `cfg` (INVALID_ARGUMENT); UNAVAILABLE when built without CUDA
  // or when no device is visible; INVALID_ARGUMENT for a device index that
  // does not exist.
  static absl::StatusOr<std::unique_ptr<CudaTransformer>> Create(
      const ModelConfig& cfg, int device = 0);

  CudaTransformer(const CudaTransformer&) = delete;
  CudaTransformer& operator=(const CudaTransformer&) = delete;
  ~CudaTransformer();

  const ModelConfig& config() const { return cfg_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  size_t num_params() const { return num_params_; }
  int device() const { return device_; }

  // As Transformer::Forward, with d_params in device memory (num_params()
  // floats) and host_tokens a HOST array of [batch][seq + 1] bytes. Keeps
  // the activations on the device for Backward.
  absl::StatusOr<float> Forward(const float* d_params,
                                const uint8_t* host_tokens, int batch,
                                int seq);

  // The loss of the last successful Forward in double; NaN before it.
  double last_loss() const { return last_loss_; }

  // Writes d(mean loss)/d(params) for the last Forward into the device
  // buffer d_grads[0, num_params()), overwriting it. d_params must be the
  // buffer of the last Forward, unchanged. FAILED_PRECONDITION without a
  // successful Forward.
  absl::Status Backward(const float* d_params, float* d_grads);

 private:
  struct Impl;  // CUDA state (stream, cuBLAS handle, workspace).

  CudaTransformer(const ModelConfig& cfg, int device);

  ModelConfig cfg_;
  int device_;
  std::vector<TensorInfo> tensors_;
  size_t num_params_ = 0;
  double last_loss_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace model
}  // namespace zenflow

#endif  // ZENFLOW_GPU_WORKER_MODEL_TRANSFORMER_CUDA_H_
