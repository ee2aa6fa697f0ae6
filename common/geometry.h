// Rules the daemon and the worker must apply identically: how a tensor's
// shape maps to rows and columns, which tensors ZenFlow keeps whole on the
// worker, how many columns fit in one message, and which rounds carry the
// predicted step's state.
//
//   const ColumnGeometry g = GeometryOf(spec.tensors(i));      // {rows, cols}
//   if (AlwaysImportant(spec.tensors(i), spec.mode())) ...
//   const int64_t per = ColumnsPerMessage(max_bytes, g.rows, 2);  // bf16
#ifndef ZENFLOW_COMMON_GEOMETRY_H_
#define ZENFLOW_COMMON_GEOMETRY_H_

#include <algorithm>
#include <cstdint>

#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

struct ColumnGeometry {
  int64_t rows = 0;
  int64_t cols = 0;
};

// A 2-D tensor W[rows, cols]; a 1-D tensor [n] is one row of n columns.
inline ColumnGeometry GeometryOf(const v1::TensorSpec& t) {
  if (t.shape_size() == 2) return {t.shape(0), t.shape(1)};
  return {1, t.shape_size() == 1 ? t.shape(0) : 0};
}

// In zenflow mode, 1-D tensors (bias, norm) and tensors marked local are
// fully important (updated on the worker); zero_offload keeps every tensor
// on the daemon.
inline bool AlwaysImportant(const v1::TensorSpec& t, v1::Mode mode) {
  return mode != v1::MODE_ZERO_OFFLOAD && (t.shape_size() == 1 || t.local());
}

// A round update's batch of delta messages (server/round_update.h): the
// most an update holds of its deltas is two batches, each at most this or
// one message (JobFootprint::delta_bytes charges it).
inline constexpr int64_t kDeltaWindowBytes = int64_t{16} << 20;

// Whether a job's one-step rounds carry the columns' state for the ranks'
// predicted step (ZenFlowConfig.predicted_step): a normalized zenflow spec
// with the option on, values deltas, an apply delay other than sync and
// rounds that can have one step. The daemon and the ranks decide alike.
// Bytes that state adds per value of a delta: bf16 m and v.
inline constexpr int64_t kPredictedStateBytesPerValue = 4;

inline bool RoundsMayCarryPredictedState(const v1::JobSpec& spec) {
  const v1::ZenFlowConfig& z = spec.zenflow();
  return spec.mode() == v1::MODE_ZENFLOW && z.predicted_step() &&
         spec.delta_kind() != v1::DELTA_ARITHMETIC &&
         z.apply_delay().kind_case() != v1::ApplyDelay::kSync &&
         (z.update_interval() == 1 || z.auto_update_interval());
}

// How many whole columns of `rows` values of `value_bytes` each fit in
// `max_bytes`; at least 1 (a column larger than the limit travels alone).
inline int64_t ColumnsPerMessage(int64_t max_bytes, int64_t rows, int64_t value_bytes) {
  const int64_t col = std::max<int64_t>(1, rows * value_bytes);
  return std::max<int64_t>(1, max_bytes / col);
}

}  // namespace zenflow

#endif  // ZENFLOW_COMMON_GEOMETRY_H_
