// The local step (docs/design.md rule 13): between rounds the daemon's
// columns would stand still on the ranks for S steps and then jump. Instead
// every rank moves them at the end of each step with that step's gradient
// (reduced across ranks with the important columns', so every rank holds the
// same values), scaled by the factored second moment the latest applied
// round's deltas carried (ParameterDelta.row_v, col_v, v_mean):
//   W[i, j] -= lr * g[i, j] / (sqrt(row_v[i] * col_v[j] / v_mean) + eps)
// (Backend::FactoredStep; no weight decay, no moments). The next round's
// values replace the result, so its error never accumulates.
//
// Per step: Begin() at its start (with Decide()'s answer), Pack() with the
// important columns (the daemon columns' gradients, shared with the
// predicted step, which never runs in the same step), FromDelta() for each
// applied delta message, End() at its end. Reset() at a reselection.
#ifndef ZENFLOW_GPU_WORKER_ENGINE_LOCAL_STEP_H_
#define ZENFLOW_GPU_WORKER_ENGINE_LOCAL_STEP_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu_worker/backend.h"
#include "gpu_worker/device_buffer.h"
#include "gpu_worker/engine/engine_tensor.h"
#include "gpu_worker/engine/round_policy.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

// Thread-compatible: the optimizer's training thread calls it.
class LocalStep {
 public:
  // `spec` is the job's normalized spec.
  LocalStep(worker::Backend* backend, const v1::JobSpec& spec);

  // Whether the job runs local steps: ZenFlowConfig.local_step (unset: the
  // default, on), zenflow mode, values deltas.
  static bool EnabledFor(const v1::JobSpec& spec);
  bool enabled() const { return enabled_; }

  // Whether step `step` ends with a local step, decided at its start (so
  // every rank reduces the same parts): not at a selection step, not with
  // the predicted step, not at a step that closes a round applied at once
  // (sync: those values already hold this step's gradient); and only with
  // a factored moment in hand or due with a round applied at this step.
  bool Decide(int64_t step, bool selection, bool predicted, bool closes_round,
              const std::deque<PendingRound>& pending) const;

  // Starts a step: `now` from Decide(), `lr` the step's learning rate.
  void Begin(bool now, float lr) {
    now_ = now;
    lr_ = lr;
  }
  // Whether this step ends with a local step (false between steps).
  bool now() const { return now_; }

  // Every tensor's factored moment is dropped: the daemon's columns change
  // at a reselection, and the next applied round brings theirs.
  void Reset();
  // Takes the factored moment an applied delta of `t` carries (none: no
  // change). INTERNAL for one that does not fit the tensor.
  absl::Status FromDelta(const EngineTensor& t, const v1::ParameterDelta& d);
  // Whether `t` has a factored moment for every one of its daemon columns.
  bool Ready(const EngineTensor& t) const;

  // Ends the step: with now(), the local step of every ready tensor's
  // daemon columns, their gradients in pbuf (column-major, in `remote`
  // order, reduced). Returns whether any tensor took one.
  absl::StatusOr<bool> End(const std::vector<std::unique_ptr<EngineTensor>>& tensors);

 private:
  // One delta message's row moments and mean, and how many columns it had.
  struct Part {
    int64_t columns = 0;
    std::vector<float> row_v;
    float v_mean = 0;
  };
  // One tensor's factored second moment, host side and (staged) backend side.
  struct Factored {
    std::vector<float> col_v;  // per daemon column, in `remote` order
    std::vector<bool> have;    // col_v[k] was received since the last reset
    int64_t have_count = 0;
    // The latest round's messages by first column. One daemon sends the
    // same row_v and v_mean in each; a tensor split over several daemons
    // gets each daemon's over its own columns, and their mean weighted by
    // columns is the tensor's (Combine()), the same whatever order the
    // messages arrived in: every rank steps with the same bits.
    int64_t round = -1;
    std::map<int32_t, Part> parts;
    bool combined = false;  // row_v, v_mean are the parts'
    std::vector<float> row_v;  // rows
    float v_mean = 0;
    bool staged = false;  // d_row_v, d_col_v hold row_v, col_v
    worker::DeviceBuffer d_row_v, d_col_v;
  };
  static void Combine(Factored* f);

  worker::Backend* const backend_;
  const bool enabled_;
  const bool sync_;  // apply delay 0
  const float eps_;
  bool now_ = false;
  float lr_ = 0;
  std::map<const EngineTensor*, std::unique_ptr<Factored>> state_;
};

}  // namespace zenflow

#endif  // ZENFLOW_GPU_WORKER_ENGINE_LOCAL_STEP_H_
