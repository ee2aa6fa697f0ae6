// One tensor as the engine holds it; see engine_tensor.h.
#include "gpu_worker/engine/engine_tensor.h"

#include <utility>

#include "common/status_macros.h"

namespace zenflow {

absl::Status SetImportantColumns(worker::Backend* backend, EngineTensor& t,
                                 std::vector<int32_t> cols) {
  t.important = std::move(cols);
  t.remote.clear();
  size_t k = 0;
  for (int32_t c = 0; c < t.cols; ++c) {
    if (k < t.important.size() && t.important[k] == c) {
      ++k;
    } else {
      t.remote.push_back(c);
    }
  }
  if (!t.important.empty()) {
    ZF_RETURN_IF_ERROR(backend->CopyToDevice(t.d_important.p(), t.important.data(),
                                             t.important.size() * 4));
  }
  if (!t.remote.empty()) {
    ZF_RETURN_IF_ERROR(backend->CopyToDevice(t.d_remote.p(), t.remote.data(), t.remote.size() * 4));
  }
  return backend->Synchronize();
}

}  // namespace zenflow
