// One tensor as the engine holds it: the caller's parameter and gradient
// buffers, which of its columns this rank updates (the important ones) and
// which the daemon does, and the device state of the important columns. The
// optimizer, the predicted step and the reselection all work on these.
#ifndef ZENFLOW_GPU_WORKER_ENGINE_ENGINE_TENSOR_H_
#define ZENFLOW_GPU_WORKER_ENGINE_ENGINE_TENSOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/codec.h"
#include "gpu_worker/backend.h"
#include "gpu_worker/device_buffer.h"

namespace zenflow {

struct EngineTensor {
  std::string name;
  int64_t rows = 0, cols = 0;
  bool always_important = false;
  DType dtype = DType::kF32;  // of param
  void* param = nullptr;
  float* grad = nullptr;
  std::vector<int32_t> important, remote;  // ascending
  std::vector<int64_t> steps;              // per important column
  // Mirrors of m, v and master (only at reselection).
  std::vector<float> host_m, host_v, host_master;
  // m, v and (16-bit parameters only) the fp32 master of the important
  // columns: compact, column-major, like the packed gradients in gbuf.
  worker::DeviceBuffer d_important, d_remote, d_steps, m, v, master, gbuf, scores;
  // The daemon's columns' gradients, packed like the shards (column-major,
  // in `remote` order) and reduced across ranks, for the predicted step or
  // the local step; reserved at the first one.
  worker::DeviceBuffer pbuf;

  bool fp32() const { return dtype == DType::kF32; }
  float* param_f32() const { return static_cast<float*>(param); }
};

// Sets t's important columns (ascending) and so its remote ones (the
// rest), and copies both lists to the device.
absl::Status SetImportantColumns(worker::Backend* backend, EngineTensor& t,
                                 std::vector<int32_t> cols);

// The backend's name for a 16-bit parameter dtype.
inline worker::PackDType Param16(DType d) {
  return d == DType::kF16 ? worker::PackDType::kF16 : worker::PackDType::kBF16;
}

}  // namespace zenflow

#endif  // ZENFLOW_GPU_WORKER_ENGINE_ENGINE_TENSOR_H_
