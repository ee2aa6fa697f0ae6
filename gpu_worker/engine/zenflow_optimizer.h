// The worker side of ZenFlow (docs/design.md rules 1-10): given the model's parameter
// and gradient buffers on a Backend, it updates the important columns in
// place every step, streams the others' gradients to zenflowd through the
// client library, applies the returned columns after the apply delay, and
// reselects the important columns with an exact state hand-off. With
// ZenFlowConfig.auto_update_interval it also chooses each round's length.
//
// It composes the engine's parts: the round schedule (round_policy.h: the
// interval and the apply delay), the predicted step (predicted_step.h), the
// local step (local_step.h) and the reselection (reselection.h); it owns the tensors, the staging of the
// shards on their way out and the application of the rounds coming back.
//
//   ZF_ASSIGN_OR_RETURN(v1::JobSpec spec, JoinOrCreateJob(&client, want, rank, backend, params));
//   ZF_ASSIGN_OR_RETURN(auto opt, ZenFlowOptimizer::Create(backend, &client, spec, rank, params));
//   for (int64_t t = 0; t < steps; ++t) { Backward(); ZF_RETURN_IF_ERROR(opt->Step(t, lr)); }
//   ZF_RETURN_IF_ERROR(opt->Finish());
#ifndef ZENFLOW_GPU_WORKER_ENGINE_ZENFLOW_OPTIMIZER_H_
#define ZENFLOW_GPU_WORKER_ENGINE_ZENFLOW_OPTIMIZER_H_

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/client.h"
#include "common/codec.h"
#include "common/mutex.h"
#include "gpu_worker/backend.h"
#include "gpu_worker/device_buffer.h"
#include "gpu_worker/engine/engine_tensor.h"
#include "gpu_worker/engine/local_step.h"
#include "gpu_worker/engine/predicted_step.h"
#include "gpu_worker/engine/reselection.h"
#include "gpu_worker/engine/round_policy.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

// One tensor of the model, in backend memory. Not owned.
//
// Parameters are fp32, bf16 or fp16 (`dtype`, which must equal the job's
// TensorSpec.dtype). For bf16 / fp16 the engine keeps an fp32 master, beside
// the fp32 m and v, of the columns it updates itself (the important ones,
// docs/design.md rule 4), runs AdamW on that master and writes the rounded values
// into `param`; the daemon keeps the fp32 master of the others and sends
// them back in the parameter's dtype. Gradients are fp32 whatever the
// parameters' dtype (the model's backward writes fp32).
struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;   // [n] or [rows, cols]
  void* param = nullptr;        // row-major, of `dtype`
  float* grad = nullptr;        // row-major fp32, written by backward before Step()
  bool local = false;           // always updated on the worker
  DType dtype = DType::kF32;    // of `param`
};

// What one Step() did and waited for.
struct StepStats {
  int64_t step = -1;
  double stall_seconds = 0;         // blocked waiting for deltas (the stall)
  double send_blocked_seconds = 0;  // blocked on the client's send window
  double step_seconds = 0;          // wall time inside Step()
  // Where the rest of the step went (wall time, including waits inside).
  double important_seconds = 0;  // important columns: reduce + AdamW on the device
  double pack_seconds = 0;       // packing remote columns (device) and copying them out
  double push_seconds = 0;       // handing packed chunks to the client (incl. send_blocked)
  double apply_seconds = 0;      // applying arrived rounds (excl. the stall)
  int64_t bytes_sent = 0;           // data stream, up (since the previous step)
  int64_t bytes_received = 0;       // data stream, down (since the previous step)
  int64_t rounds_applied = 0;
  int64_t max_staleness_steps = 0;  // step - close step of an applied round
  bool reselected = false;
  // The step ended with the predicted step (rule 11) on the daemon's columns.
  bool predicted = false;
  // The step ended with the local step (rule 13) on the daemon's columns.
  bool local_step = false;
  // Steps of the round this step belongs to: the update interval S in use
  // (with auto_update_interval it changes from round to round).
  int32_t update_interval = 0;
};

struct OptimizerTotals {
  int64_t steps = 0;
  double stall_seconds = 0;
  double send_blocked_seconds = 0;
  double step_seconds = 0;
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  int64_t rounds_applied = 0;
  int64_t reselections = 0;
  // Rounds closed (a partial last one included) and the sum of their
  // steps: round_steps / rounds_closed is the mean update interval.
  int64_t rounds_closed = 0;
  int64_t round_steps = 0;
  // Steps that ended with the predicted step (rule 11).
  int64_t predicted_steps = 0;
  // Steps that ended with the local step (rule 13).
  int64_t local_steps = 0;
  // Applied rounds whose RoundDone reported an update divergence (rule 14)
  // and the sum of those: divergence_sum / divergence_rounds is the mean.
  int64_t divergence_rounds = 0;
  double divergence_sum = 0;
};

// Creates the job (rank 0, with the initial parameter values read from the
// backend and uploaded in each parameter's dtype) or waits for it to exist
// and be uploaded (other ranks), joins as `rank` and returns the job's
// normalized spec. `want` names the tensors and settings; its tensors must
// match `params` (a TensorSpec.dtype left unset takes the ParamSpec's).
absl::StatusOr<v1::JobSpec> JoinOrCreateJob(Client* client, const v1::JobSpec& want, int32_t rank,
                                            worker::Backend* backend,
                                            const std::vector<ParamSpec>& params);

// One tensor's packed important-column gradients in backend memory: fp32,
// column-major [ncols][rows], `n` values.
struct ReducePart {
  std::string tensor;
  float* device = nullptr;
  int64_t n = 0;
};
// Replaces every part, in place, with its mean over the job's ranks, the
// same on every rank (docs/design.md rule 4: the important columns' gradients are
// reduced across ranks before their AdamW). Called with the same parts on
// every rank at every step; a status other than OK fails the step.
using GradientReducer =
    std::function<absl::Status(int64_t step, const std::vector<ReducePart>& parts)>;

// How the engine holds its shards on the way out.
struct EngineOptions {
  // Pinned host memory (and as much device memory) for packed shards in
  // flight, in buffers of 4 MiB (at least two; at least one column each).
  // Step() returns once a step's shards are packed into it; the client
  // sends them while the device runs the next step. Below a step's
  // unimportant gradient bytes, Step() waits for the daemon to take in the
  // rest (counted in StepStats push_seconds).
  size_t staging_bytes = 32 << 20;
};

// Thread-compatible: one training thread calls it.
class ZenFlowOptimizer {
 public:
  // `client` is attached to the job as `rank`; `spec` is the job's spec as
  // JoinJob returned it. Fails with INVALID_ARGUMENT / OUT_OF_RANGE when the
  // parameters or the rank disagree with the job.
  static absl::StatusOr<std::unique_ptr<ZenFlowOptimizer>> Create(
      worker::Backend* backend, Client* client, const v1::JobSpec& spec, int32_t rank,
      std::vector<ParamSpec> params, EngineOptions options = {});
  ~ZenFlowOptimizer();
  ZenFlowOptimizer(const ZenFlowOptimizer&) = delete;
  ZenFlowOptimizer& operator=(const ZenFlowOptimizer&) = delete;

  // How ranks reduce the important columns' gradients (world_size > 1).
  // Default: the daemon's AllReduce call (through host memory, summed in
  // rank order: bit-identical everywhere). On GPUs a collective library
  // does it device to device (e.g. an NCCL all-reduce and a scale by
  // 1/world), keeping these bytes off the host and the daemon. Set before
  // the first Step().
  void set_gradient_reducer(GradientReducer reducer) { reducer_ = std::move(reducer); }
  // With auto_update_interval (docs/design.md rule 10), the rounds after warm-up
  // take their length from `chooser` instead of from the daemon's measured
  // round time (tests, or a caller's own schedule). Its answer is clamped to
  // [1, update_interval], then adjusted as a measured choice is: raised to
  // the previous round's apply delay while that round is in flight, and cut
  // so that the round ends before the next selection step. Ignored without
  // auto_update_interval. Set before the first Step().
  void set_interval_chooser(IntervalChooser chooser) { policy_.set_chooser(std::move(chooser)); }

  // Runs the optimizer for step `step` (0, 1, 2, ... in order) with the
  // gradients now in the ParamSpec grad buffers and learning rate `lr`.
  absl::Status Step(int64_t step, float lr);
  // Waits for and applies every update still in flight.
  absl::Status Finish();
  // Applies every round in flight now (earlier than its apply delay says),
  // without closing a round: FAILED_PRECONDITION unless the next step
  // starts a round (with a fixed update_interval, a multiple of it; with
  // auto_update_interval, the step after a round's last). Training may go on.
  absl::Status Drain();

  // The state of the columns this rank updates itself (the important
  // ones: every column of an always-important tensor), one ColumnState per
  // tensor that has any: ascending columns, values, m, v, update counts.
  // Between steps; with rounds in flight the daemon's side may move on.
  absl::StatusOr<std::vector<v1::ColumnState>> LocalState();

  const StepStats& last_step() const { return last_; }
  const OptimizerTotals& totals() const { return totals_; }
  // What this rank has reported to the daemon with its round closes (every
  // step's figures go with the next close; the last steps after the final
  // close are not reported).
  const v1::WorkerStats& reported() const { return reported_; }
  // The last Step()'s figures, as reported to the daemon.
  const v1::StepReport& last_report() const { return last_report_; }
  int64_t selection_version() const { return version_; }
  // The apply delay chosen for `round` (-1 if not decided yet).
  int32_t apply_delay(int64_t round) const { return policy_.apply_delay(round); }

 private:
  ZenFlowOptimizer(worker::Backend* backend, Client* client, const v1::JobSpec& spec,
                   int32_t rank);
  absl::Status Init(std::vector<ParamSpec> params);
  absl::Status UpdateImportant(int64_t step, float lr);
  absl::Status PushRemote(int64_t step);
  // Closes `round` (of `steps` steps), carrying the unreported step figures.
  absl::Status CloseRound(int64_t round, float lr, int32_t steps);
  absl::Status ApplyRound(const PendingRound& p, int64_t step);
  absl::Status ApplyDue(int64_t step, bool drain);

  worker::Backend* const backend_;
  Client* const client_;
  GradientReducer reducer_;  // empty: the daemon's AllReduce
  const v1::JobSpec spec_;
  const int32_t rank_;
  RoundPolicy policy_;
  PredictedStep predicted_;
  LocalStep local_;
  Reselection reselection_;
  DType wire_ = DType::kBF16;
  worker::PackDType pack_wire_ = worker::PackDType::kBF16;
  std::vector<std::unique_ptr<EngineTensor>> tensors_;
  int64_t next_step_ = 0;
  int64_t version_ = 0;
  // The round in progress, or the next one before its first step: its
  // number, first step and steps (0 until chosen at its first step).
  int64_t round_ = 0;
  int64_t round_start_ = 0;
  int32_t round_steps_ = 0;
  std::deque<PendingRound> pending_;
  // Staging for packed shards: a ring of device and host buffers. The client
  // sends straight from a host buffer (UCX) and releases it when done; a
  // buffer is packed again only once released.
  struct StageRing {
    Mutex mu;
    std::vector<bool> busy ABSL_GUARDED_BY(mu);
  };
  EngineOptions options_;
  int stages_ = 0;  // buffers in the ring
  static constexpr size_t kPackBatch = 4;  // chunks packed per synchronize
  std::vector<void*> stage_dev_, stage_host_;
  std::shared_ptr<StageRing> ring_ = std::make_shared<StageRing>();
  int next_stage_ = 0;
  size_t stage_bytes_ = 0;
  worker::DeviceBuffer scratch_cols_, scratch_vals_;  // applying deltas; LocalState
  std::unique_ptr<worker::DeviceBuffer[]> scales_dev_;  // int8 wire: per-column scales
  std::vector<std::vector<float>> scales_host_;
  float last_lr_ = 0;
  ClientStats snapshot_;  // client stats at the end of the last step
  bool have_snapshot_ = false;
  StepStats last_;
  OptimizerTotals totals_;
  // Steps whose figures have not gone to the daemon yet, and the sums of
  // those that have.
  std::vector<v1::StepReport> unreported_;
  v1::WorkerStats reported_;
  int64_t last_staleness_ = 0;  // the largest since the last close
  v1::StepReport last_report_;
};

}  // namespace zenflow

#endif  // ZENFLOW_GPU_WORKER_ENGINE_ZENFLOW_OPTIMIZER_H_
