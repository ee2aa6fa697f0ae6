// The predicted step (rule 11, docs/engine.md): when a job's rounds
// have one step, the daemon's columns would take their AdamW step one step
// late. The ranks instead run the daemon's next step of those columns
// themselves, with the step's gradient at hand and the columns' state the
// one-step round's deltas carry (or, at step 0, the zero state of a new
// job), so the parameters the next forward pass reads are those the daemon
// will compute.
//
// Per step: Begin() at its start (with Decide()'s answer), Pack() with the
// important columns, FromDelta() for each applied delta message that
// carries state (or FromZero() at step 0), End() at its end.
#ifndef ZENFLOW_GPU_WORKER_ENGINE_PREDICTED_STEP_H_
#define ZENFLOW_GPU_WORKER_ENGINE_PREDICTED_STEP_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/adamw.h"
#include "gpu_worker/backend.h"
#include "gpu_worker/device_buffer.h"
#include "gpu_worker/engine/engine_tensor.h"
#include "gpu_worker/engine/round_policy.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

// Thread-compatible: the optimizer's training thread calls it.
class PredictedStep {
 public:
  // `enabled`: the job's rounds may carry the state
  // (RoundsMayCarryPredictedState, as the daemon decides).
  PredictedStep(worker::Backend* backend, const v1::AdamWConfig& adamw, bool enabled)
      : backend_(backend), adamw_(adamw), enabled_(enabled) {}

  bool enabled() const { return enabled_; }

  // Whether step `step`, of a round of `round_steps` steps, ends with a
  // predicted step, decided at its start from the rounds in flight.
  static bool Decide(bool enabled, int64_t step, int32_t round_steps,
                     const std::deque<PendingRound>& pending);

  // Starts a step: `now` from Decide(), `lr` the step's learning rate.
  void Begin(bool now, float lr) {
    now_ = now;
    lr_ = lr;
    messages_ = 0;
  }
  // Whether this step has a predicted step (false between steps).
  bool now() const { return now_; }
  // Whether the applied delta `d` of `p` at `step` carries the state for
  // this step's prediction.
  bool Carries(const PendingRound& p, int64_t step, const v1::ParameterDelta& d) const {
    return now_ && p.steps == 1 && step == p.close_step + 1 && !d.m().empty();
  }

  // Packs every tensor's daemon columns' gradients into its pbuf (fp32,
  // column-major, in `remote` order), to be reduced across ranks with the
  // important columns'.
  absl::Status Pack(const std::vector<std::unique_ptr<EngineTensor>>& tensors);
  // The step on the columns of one delta message (state from the message),
  // already applied at `cols` (backend memory) of `t`.
  absl::Status FromDelta(EngineTensor* t, const v1::ParameterDelta& d, const int32_t* cols);
  // Step 0's: every tensor's daemon columns from the zero state of a new job.
  absl::Status FromZero(const std::vector<std::unique_ptr<EngineTensor>>& tensors);

  // Ends step `step`: whether it ended with a predicted step.
  bool End(int64_t step) {
    const bool predicted = now_ && (step == 0 || messages_ > 0);
    now_ = false;
    messages_ = 0;
    return predicted;
  }

 private:
  // The daemon's AdamW step on `n` columns of `t` (backend memory; master
  // for 16-bit tensors only), with the step's lr.
  absl::Status AdamW(EngineTensor* t, const int32_t* cols, int64_t n, const int64_t* steps,
                     const float* g, float* m, float* v, float* master);
  // `host` itself on the CPU backend, else a copy in `buf`.
  absl::StatusOr<void*> Staged(worker::DeviceBuffer* buf, void* host, size_t bytes);

  worker::Backend* const backend_;
  const v1::AdamWConfig adamw_;
  const bool enabled_;
  bool now_ = false;
  int64_t messages_ = 0;  // this step's deltas predicted from
  float lr_ = 0;
  worker::DeviceBuffer scratch_m_, scratch_v_, scratch_master_, scratch_steps_, scratch_all_;
  std::vector<float> host_;  // a message's m, v (and master) in fp32
};

}  // namespace zenflow

#endif  // ZENFLOW_GPU_WORKER_ENGINE_PREDICTED_STEP_H_
