// What a client may ask for when it creates a job, checked before anything
// is allocated: the job id, the spec's defaults and limits, a partition's
// map of tensors over daemons, and the bytes the job will hold. The
// registry runs these before it makes a Job; the Job trusts their result.
//
//   ZF_RETURN_IF_ERROR(NormalizeJobSpec(&spec, max_message_bytes));
//   ZF_ASSIGN_OR_RETURN(JobFootprint f, ComputeJobFootprint(spec));
#ifndef ZENFLOW_SERVER_JOB_SPEC_H_
#define ZENFLOW_SERVER_JOB_SPEC_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

// Limits on what a client can name (documented in docs/protocol.md#job-settings-jobspec).
inline constexpr size_t kMaxJobIdBytes = 128;
inline constexpr size_t kMaxTensorNameBytes = 256;
inline constexpr int kMaxTensors = 1 << 16;
inline constexpr int kMaxPartitionParts = 64;  // daemons one job may spread over
inline constexpr int64_t kMaxTensorDim = int64_t{1} << 31;  // of a shape's dimension

// What a job allocates, by part (docs/operating.md#memory-of-a-job). Every figure is what the
// Job constructor and its round updates really allocate, so the registry can
// refuse a job before allocating any of it.
// fidelity_budget when a zenflow job leaves it unset (docs/design.md rules
// 10 and 14): update_interval auto does not choose an S whose measured
// update divergence exceeded it. Measured on the demo's fine-tuning with the
// default rules (12 and 13 off: one AdamW step stands for S, divergence about
// 1 - 1/S: 0.52, 0.77, 0.89 at S = 2, 4, 8), it admits the default S_max 4
// and caps S = 8 (with rules 12 and 13 on: 0.30-0.42 at S 4, 0.76-0.85 at 8).
inline constexpr float kDefaultFidelityBudget = 0.8f;

struct JobFootprint {
  int64_t params = 0;
  // fp32 master, m, v and two accumulation buffers: 20 B per parameter
  // (the upload is staged in an accumulation buffer: nothing extra); with
  // rank_ordered_sums, two accumulation buffers per rank: 12 + 8 * world B.
  // With optimizer_state "8bit", m and v take 1 B each plus a 4 B scale
  // each per block of 256 (tensors of at least 16 rows): about 14 B.
  int64_t state_bytes = 0;
  // Per column: update count, selection flag and lists (17 B) and its
  // number among the daemon's columns (4 B); per rank and step of its open
  // round, the runs of columns it sent (RankArrivals: never per rank and
  // column); the
  // update divergence's side buffers (server/divergence.h: about 1% of the
  // columns x min(S, 16) steps, per rank when rank-ordered, two rounds).
  int64_t bookkeeping_bytes = 0;
  // One round's deltas, held once for every rank (plus the old values for
  // arithmetic deltas), for the two rounds that can be queued at a time;
  // with the local step, also the factored second moment's sums and result
  // while an update runs (docs/design.md rule 13).
  int64_t delta_bytes = 0;
  int64_t total() const { return state_bytes + bookkeeping_bytes + delta_bytes; }
};

// RESOURCE_EXHAUSTED when the sizes overflow 64-bit arithmetic. `spec` must
// be normalized.
absl::StatusOr<JobFootprint> ComputeJobFootprint(const v1::JobSpec& spec);

// INVALID_ARGUMENT (quoting a short prefix) unless `id` is 1-128 characters
// from [A-Za-z0-9._-].
absl::Status CheckJobId(absl::string_view id);

// A shape as "[2, 3]", for messages.
std::string ShapeString(const google::protobuf::RepeatedField<int64_t>& shape);

// Fills defaults into `spec` and checks it. INVALID_ARGUMENT names the field.
absl::Status NormalizeJobSpec(v1::JobSpec* spec, int64_t max_message_bytes);
// Checks spec.partition (NormalizeJobSpec calls it when it is set).
absl::Status CheckPartition(const v1::JobSpec& spec);

// Whether every round's deltas carry the factored second moment of their
// tensor's columns (ParameterDelta.row_v, col_v, v_mean) for the ranks'
// local step (docs/design.md rule 13): a normalized zenflow spec with
// local_step on and values deltas.
bool DeltasCarryFactoredMoment(const v1::JobSpec& spec);

// The learning rate of the one AdamW step the daemon takes for a round of
// `steps` steps closed with `lr` (docs/design.md rule 12): with
// scale_round_step, lr * steps (one fp32 product), else lr. The decoupled
// weight decay multiplies it, so it scales alike.
float RoundStepLr(const v1::JobSpec& spec, float lr, int32_t steps);

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_JOB_SPEC_H_
