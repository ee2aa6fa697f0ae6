// The framework-neutral worker: the engine (ZenFlowOptimizer), its backend
// and its client over a framework's own arrays (array_ref.h). Host arrays
// run on the CPU backend; device arrays on the CUDA backend of the device
// that holds them, ordered with the caller's CUDA stream. This is the entry
// the Python extension (python/zenflow_ext.cc) and the device check
// (gpu_worker/cuda_path_check.cc) share.
//
//   ArrayWorkerOptions o;  o.want = spec; o.client.target = "127.0.0.1:50051";
//   o.stream = producer_stream;  // device arrays: the stream backward ran on
//   ZF_ASSIGN_OR_RETURN(auto w, ArrayWorker::Create(o, arrays));
//   for (t...) { Backward(stream); ZF_RETURN_IF_ERROR(w->Step(t, lr, stream)); }
//   ZF_RETURN_IF_ERROR(w->Finish(stream));
//
// Streams: every call that touches the arrays first makes the backend's
// stream wait for the work queued on the caller's stream so far (the
// gradients backward wrote), then makes the caller's stream wait for the
// backend's work (the parameters it wrote): events only, no host wait on
// the caller's stream and no device-wide synchronize. The engine's own
// waits are on the backend's stream (Backend::Synchronize). Host arrays
// have no stream: the handle is ignored. Thread-compatible.
#ifndef ZENFLOW_GPU_WORKER_ENGINE_ARRAY_WORKER_H_
#define ZENFLOW_GPU_WORKER_ENGINE_ARRAY_WORKER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/client.h"
#include "gpu_worker/backend.h"
#include "gpu_worker/engine/array_ref.h"
#include "gpu_worker/engine/zenflow_optimizer.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

struct ArrayWorkerOptions {
  v1::JobSpec want;  // the job to create (rank 0) or join; tensors as the arrays
  int32_t rank = 0;
  ClientOptions client;
  int threads = 2;       // the CPU backend's (host arrays)
  uintptr_t stream = 0;  // the caller's CUDA stream while Create() runs
};

class ArrayWorker {
 public:
  // Checks the arrays (CheckPlacement; device arrays all on one device),
  // makes the backend (UNAVAILABLE for device arrays without a device or a
  // CUDA build), connects, creates or joins the job and makes the engine.
  static absl::StatusOr<std::unique_ptr<ArrayWorker>> Create(const ArrayWorkerOptions& options,
                                                             const std::vector<ArrayParam>& arrays);
  ~ArrayWorker();
  ArrayWorker(const ArrayWorker&) = delete;
  ArrayWorker& operator=(const ArrayWorker&) = delete;

  // The engine's calls, ordered with `stream` (see above).
  absl::Status Step(int64_t step, float lr, uintptr_t stream);
  absl::Status Finish(uintptr_t stream);
  absl::Status Drain(uintptr_t stream);
  absl::StatusOr<std::vector<v1::ColumnState>> LocalState(uintptr_t stream);
  // The daemon's side (no arrays touched).
  absl::StatusOr<v1::ColumnState> GetState(const std::string& tensor, int64_t* version);
  absl::Status SetState(const v1::ColumnState& state);
  absl::StatusOr<v1::DeleteJobResponse> EndJob(bool keep);
  // Ends the engine, the backend and the connection; later calls fail
  // with FAILED_PRECONDITION.
  void Close();

  bool closed() const { return opt_ == nullptr; }
  const v1::JobSpec& spec() const { return spec_; }
  // "cpu" or "cuda", and the CUDA device (-1 for host arrays).
  std::string backend_name() const { return backend_name_; }
  int device() const { return device_; }
  // Live only (closed() false).
  const ZenFlowOptimizer& optimizer() const { return *opt_; }
  Client& client() const { return *client_; }

 private:
  ArrayWorker() = default;
  absl::Status Live() const;
  absl::Status Before(uintptr_t stream);
  absl::Status After(uintptr_t stream, absl::Status s);

  int32_t rank_ = 0;
  int device_ = -1;
  std::string backend_name_;
  std::unique_ptr<worker::Backend> backend_;
  std::unique_ptr<Client> client_;
  v1::JobSpec spec_;
  std::unique_ptr<ZenFlowOptimizer> opt_;
};

}  // namespace zenflow

#endif  // ZENFLOW_GPU_WORKER_ENGINE_ARRAY_WORKER_H_
