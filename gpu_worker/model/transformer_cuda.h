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
//   ZF_ASSIGN_OR_RETURN(auto model, CudaTransformer::Create(cfg));
//   ZF_ASSIGN_OR_RETURN(auto params, CudaBuffer::Create(model->num_params()));
//   ZF_ASSIGN_OR_RETURN(auto grads, CudaBuffer::Create(model->num_params()));
//   ZF_RETURN_IF_ERROR(params->CopyFromHost(host_params.data(), n));
//   ZF_ASSIGN_OR_RETURN(float loss, model->Forward(params->data(), tokens,
//                                                  batch, seq));
//   ZF_RETURN_IF_ERROR(model->Backward(params->data(), grads->data()));

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

// Number of visible CUDA devices; 0 without CUDA or when the query fails.
int CudaModelDeviceCount();

// An fp32 device allocation (cudaMalloc) with host copies, so callers and
// tests need no CUDA headers. Not thread-safe; movable only via unique_ptr.
class CudaBuffer {
 public:
  // `count` floats (>= 1) on `device`. UNAVAILABLE without CUDA or device,
  // RESOURCE_EXHAUSTED when the allocation fails.
  static absl::StatusOr<std::unique_ptr<CudaBuffer>> Create(size_t count,
                                                            int device = 0);
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;
  ~CudaBuffer();

  float* data() const { return data_; }
  size_t size() const { return count_; }
  int device() const { return device_; }

  // Copies of the first n <= size() floats; complete when they return.
  absl::Status CopyFromHost(const float* src, size_t n);
  absl::Status CopyToHost(float* dst, size_t n) const;

 private:
  CudaBuffer(float* data, size_t count, int device)
      : data_(data), count_(count), device_(device) {}
  float* data_;
  size_t count_;
  int device_;
};

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
