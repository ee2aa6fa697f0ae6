// Reselection with an exact state hand-off (rule 8): at a selection
// step every rank sends its columns' importance scores to the daemon, which
// picks the job's new important columns; the columns that leave this rank
// go to the daemon with their exact values, m, v and update counts, and the
// columns that join come back with the daemon's. The rounds in flight are
// drained before (the optimizer does that).
#ifndef ZENFLOW_GPU_WORKER_ENGINE_RESELECTION_H_
#define ZENFLOW_GPU_WORKER_ENGINE_RESELECTION_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/client.h"
#include "gpu_worker/backend.h"
#include "gpu_worker/device_buffer.h"
#include "gpu_worker/engine/engine_tensor.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

// The columns of ascending `a` that are not in ascending `b`, ascending.
std::vector<int32_t> ColumnDifference(const std::vector<int32_t>& a, const std::vector<int32_t>& b);

// Groups consecutive tensors, in order, into hand-off calls of at most
// `limit` bytes each (`moved[i]` is tensor i's; a tensor larger than the
// limit goes alone). Returns each call's tensor indices.
std::vector<std::vector<size_t>> HandOffCalls(const std::vector<double>& moved, double limit);

// A tensor's important-column state in the compact layout: column-major m,
// v and (16-bit parameters) the fp32 master, one column per `columns`
// entry, and each column's update count.
struct CompactState {
  std::vector<float> m, v, master;
  std::vector<int64_t> steps;
};

// The compact state of `now` (ascending), the tensor's new important
// columns: a column it already had keeps its state (from the host mirrors
// host_m, host_v, host_master and steps, in `important` order), a joining
// one takes the daemon's from `join` (null when none joins). INTERNAL when
// a joining column has no state in `join`.
absl::StatusOr<CompactState> NextCompactState(const EngineTensor& t,
                                              const std::vector<int32_t>& now,
                                              const v1::ColumnState* join);

// Thread-compatible: the optimizer's training thread calls it.
class Reselection {
 public:
  // The ~bytes of one HandOff call: large models take several, so that no
  // message outgrows the gRPC limits.
  static constexpr double kHandOffBytes = 64.0 * (1 << 20);

  Reselection(worker::Backend* backend, Client* client, v1::ImportanceMetric importance)
      : backend_(backend), client_(client), importance_(importance) {}

  // Runs the reselection of `step` on `tensors` (their gradients are the
  // step's) and returns the new selection version. The tensors' important
  // and remote columns, state and parameters then follow it.
  absl::StatusOr<int64_t> Run(int64_t step,
                              const std::vector<std::unique_ptr<EngineTensor>>& tensors);

 private:
  worker::Backend* const backend_;
  Client* const client_;
  const v1::ImportanceMetric importance_;
  worker::DeviceBuffer scratch_cols_, scratch_vals_;
};

}  // namespace zenflow

#endif  // ZENFLOW_GPU_WORKER_ENGINE_RESELECTION_H_
