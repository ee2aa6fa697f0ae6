// RuntimeArrays for builds without nvcc: nothing to allocate on.
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu_worker/runtime_arrays.h"

namespace zenflow::worker {

absl::StatusOr<std::unique_ptr<RuntimeArrays>> RuntimeArrays::Create(int device) {
  return absl::UnavailableError("built without CUDA: no device memory to allocate");
}

}  // namespace zenflow::worker
