// The framework-neutral worker; see array_worker.h.
#include "gpu_worker/engine/array_worker.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace zenflow {
namespace {

// The one device that holds every array (INVALID_ARGUMENT for two).
absl::StatusOr<int> DeviceOfAll(const std::vector<ArrayParam>& arrays) {
  int device = -1;
  std::string first;
  for (const ArrayParam& p : arrays) {
    for (const ArrayRef* a : {&p.param, &p.grad}) {
      if (ArrayElements(*a) == 0) continue;
      ZF_ASSIGN_OR_RETURN(int d, worker::CudaPointerDevice(reinterpret_cast<void*>(a->data)));
      if (device < 0) {
        device = d;
        first = p.name;
      } else if (d != device) {
        return absl::InvalidArgumentError(absl::StrCat(
            a == &p.param ? "parameter '" : "the gradient of parameter '", p.name,
            "' is on CUDA device ", d, " but parameter '", first, "' on device ", device,
            ": one optimizer runs on one device; make one optimizer per device (one rank per "
            "GPU, each with its model on its own device)"));
      }
    }
  }
  if (device < 0) return absl::InvalidArgumentError("every array is empty");
  return device;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ArrayWorker>> ArrayWorker::Create(
    const ArrayWorkerOptions& options, const std::vector<ArrayParam>& arrays) {
  ZF_ASSIGN_OR_RETURN(Placement where, CheckPlacement(arrays));
  std::unique_ptr<ArrayWorker> w(new ArrayWorker());
  w->rank_ = options.rank;
  if (where.device) {
    ZF_ASSIGN_OR_RETURN(w->device_, DeviceOfAll(arrays));
    ZF_ASSIGN_OR_RETURN(w->backend_, worker::MakeCudaBackend(w->device_));
  } else {
    if (options.threads < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("threads must be >= 1, not ", options.threads));
    }
    w->backend_ = worker::MakeCpuBackend(options.threads);
  }
  w->backend_name_ = w->backend_->name();
  ZF_ASSIGN_OR_RETURN(w->client_, Client::Connect(options.client));
  // The job's creation reads the parameters' initial values; the engine's
  // creation may write them (the daemon's columns of a job joined late).
  ZF_RETURN_IF_ERROR(w->Before(options.stream));
  absl::StatusOr<v1::JobSpec> spec = JoinOrCreateJob(w->client_.get(), options.want,
                                                      options.rank, w->backend_.get(),
                                                      where.params);
  if (!spec.ok()) return w->After(options.stream, spec.status());
  w->spec_ = *std::move(spec);
  absl::StatusOr<std::unique_ptr<ZenFlowOptimizer>> opt = ZenFlowOptimizer::Create(
      w->backend_.get(), w->client_.get(), w->spec_, options.rank, std::move(where.params));
  if (!opt.ok()) return w->After(options.stream, opt.status());
  w->opt_ = *std::move(opt);
  ZF_RETURN_IF_ERROR(w->After(options.stream, absl::OkStatus()));
  return w;
}

ArrayWorker::~ArrayWorker() { Close(); }

absl::Status ArrayWorker::Live() const {
  if (opt_ == nullptr) return absl::FailedPreconditionError("the optimizer was closed");
  return absl::OkStatus();
}

absl::Status ArrayWorker::Before(uintptr_t stream) {
  if (device_ < 0) return absl::OkStatus();  // host arrays: no stream
  return backend_->WaitForStream(stream);
}

// The caller's stream waits for whatever the backend queued, also when the
// call failed half way (parameters may have been written).
absl::Status ArrayWorker::After(uintptr_t stream, absl::Status s) {
  if (device_ < 0) return s;
  const absl::Status signal = backend_->SignalStream(stream);
  return s.ok() ? signal : s;
}

absl::Status ArrayWorker::Step(int64_t step, float lr, uintptr_t stream) {
  ZF_RETURN_IF_ERROR(Live());
  ZF_RETURN_IF_ERROR(Before(stream));
  return After(stream, opt_->Step(step, lr));
}

absl::Status ArrayWorker::Finish(uintptr_t stream) {
  ZF_RETURN_IF_ERROR(Live());
  ZF_RETURN_IF_ERROR(Before(stream));
  return After(stream, opt_->Finish());
}

absl::Status ArrayWorker::Drain(uintptr_t stream) {
  ZF_RETURN_IF_ERROR(Live());
  ZF_RETURN_IF_ERROR(Before(stream));
  return After(stream, opt_->Drain());
}

absl::StatusOr<std::vector<v1::ColumnState>> ArrayWorker::LocalState(uintptr_t stream) {
  ZF_RETURN_IF_ERROR(Live());
  ZF_RETURN_IF_ERROR(Before(stream));
  absl::StatusOr<std::vector<v1::ColumnState>> out = opt_->LocalState();
  ZF_RETURN_IF_ERROR(After(stream, out.status()));
  return out;
}

absl::StatusOr<v1::ColumnState> ArrayWorker::GetState(const std::string& tensor,
                                                      int64_t* version) {
  ZF_RETURN_IF_ERROR(Live());
  return client_->GetState(spec_.job_id(), tensor, version);
}

absl::Status ArrayWorker::SetState(const v1::ColumnState& state) {
  ZF_RETURN_IF_ERROR(Live());
  return client_->SetState(spec_.job_id(), state);
}

absl::StatusOr<v1::DeleteJobResponse> ArrayWorker::EndJob(bool keep) {
  ZF_RETURN_IF_ERROR(Live());
  return client_->FinishJob(spec_.job_id(), rank_, keep);
}

void ArrayWorker::Close() {
  opt_.reset();
  client_.reset();
  backend_.reset();
}

}  // namespace zenflow
