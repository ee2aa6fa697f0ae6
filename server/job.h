// One optimizer job inside zenflowd: its tensors' fp32 master, Adam moments
// and accumulation buffers (column-major), the rounds of every rank, the
// column selection and the update that turns a closed round into parameter
// deltas (DESIGN rules 5-9). No gRPC here: the service adapts it.
//
//   ZF_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, Job::Create(spec, ctx));
//   ZF_RETURN_IF_ERROR(job->Join(0).status());
//   ZF_RETURN_IF_ERROR(job->HandleUp(0, up_message));   // shards, round closes
#ifndef ZENFLOW_SERVER_JOB_H_
#define ZENFLOW_SERVER_JOB_H_

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "common/codec.h"
#include "common/thread_pool.h"
#include "server/adamw.h"
#include "server/mailbox.h"
#include "server/serial_executor.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

// Daemon-wide resources a job uses. Not owned.
struct JobContext {
  ThreadPool* pool = nullptr;          // AdamW and accumulation workers
  SerialExecutor* executor = nullptr;  // runs round updates in order
  SimdLevel simd = SimdLevel::kScalar;
};

// Counts of rejected requests by status code. Thread-safe.
class RejectionCounter {
 public:
  void Add(absl::StatusCode code) {
    counts_[static_cast<int>(code) & 31].fetch_add(1, std::memory_order_relaxed);
  }
  void Export(google::protobuf::Map<std::string, int64_t>* out) const;

 private:
  std::array<std::atomic<int64_t>, 32> counts_{};
};

// Fills defaults into `spec` and checks it. INVALID_ARGUMENT names the field.
absl::Status NormalizeJobSpec(v1::JobSpec* spec, int64_t max_message_bytes);

// Thread-safe. Every method validates completely before it changes anything,
// so a rejected request leaves the job exactly as it was.
class Job : public std::enable_shared_from_this<Job> {
 public:
  // `spec` must already be normalized.
  static std::shared_ptr<Job> Create(const v1::JobSpec& spec, JobContext ctx);

  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  const v1::JobSpec& spec() const { return spec_; }
  int64_t params() const { return params_; }

  // Staging area of one UploadParameters stream; commits atomically.
  // Not thread-safe (one per stream).
  class Upload {
   public:
    explicit Upload(std::shared_ptr<Job> job);
    absl::Status AddChunk(const v1::UploadParametersRequest& chunk);
    // Fails (and commits nothing) unless every tensor is complete;
    // ALREADY_EXISTS after another upload committed.
    absl::StatusOr<v1::UploadParametersResponse> Commit();

   private:
    std::shared_ptr<Job> job_;
    std::vector<std::vector<float>> staged_;  // row-major, per tensor
    std::vector<int64_t> filled_;
  };

  absl::StatusOr<v1::JoinJobResponse> Join(int32_t rank);
  void Describe(v1::GetJobResponse* out);
  void Stats(v1::JobStats* out);

  // The mailbox of a joined rank, for its data stream.
  absl::StatusOr<std::shared_ptr<Mailbox>> MailboxFor(int32_t rank);
  // A stream attached: the message that greets it.
  v1::DownMessage AttachedMessage(int32_t rank);

  // A shard or a round-close marker from `rank` (already attached).
  absl::Status HandleUp(int32_t rank, const v1::UpMessage& up);

  // Calls `done` (possibly on another thread, possibly before returning)
  // once every rank has submitted importance for the same step and every
  // closed round has been updated.
  void SubmitImportance(const v1::SubmitImportanceRequest& req,
                        std::function<void(absl::StatusOr<v1::Selection>)> done);

  absl::StatusOr<v1::HandOffResponse> HandOff(const v1::HandOffRequest& req);

  // Calls `done` once every rank has sent its parts for the same step.
  void AllReduce(const v1::AllReduceRequest& req,
                 std::function<void(absl::StatusOr<v1::AllReduceResponse>)> done);

  // The job was deleted: fails waiters and all later calls with NOT_FOUND.
  void Shutdown();

  void CountRejection(absl::StatusCode code) { rejected_.Add(code); }

  // For tests: exact fp32 state of one column (values, m, v, count).
  absl::StatusOr<v1::ColumnState> ReadColumns(const std::string& tensor,
                                              const std::vector<int32_t>& cols);

 private:
  struct TensorState {
    std::string name;
    int64_t rows = 0;
    int64_t cols = 0;
    bool always_important = false;  // 1-D or local (in zenflow mode)
    DType param_dtype = DType::kF32;
    // Column-major [cols][rows].
    std::vector<float> master, m, v;
    std::vector<int64_t> count;               // updates per column
    std::array<std::vector<float>, 2> acc;     // by round parity
    std::vector<uint8_t> important;           // current selection
    std::vector<int32_t> important_cols;      // ascending
    std::vector<int32_t> prev_important_cols;  // before the last reselection
    // Per rank: last step a column was received, hits in the open round.
    std::vector<std::vector<int64_t>> last_step;
    std::vector<std::vector<int32_t>> round_hits;
  };

  struct RankState {
    bool joined = false;
    int64_t next_round = 0;          // first round this rank has not closed
    int64_t handed_off_version = 0;  // selection version whose state it has
    std::vector<int64_t> tensor_handed_off;  // per tensor, the version handed off
    std::shared_ptr<Mailbox> mailbox = std::make_shared<Mailbox>();
  };

  struct RoundState {
    int32_t closed = 0;
    int64_t steps_sum = 0;
    float lr = 0.0f;
    bool nonfinite = false;
    std::chrono::steady_clock::time_point last_close;
    double interval_seconds = 0;  // previous round's last close -> this one's
  };

  struct PendingReduce {
    std::vector<bool> submitted;
    int32_t count = 0;
    std::vector<v1::AllReduceRequest> parts;  // by rank
    std::vector<std::function<void(absl::StatusOr<v1::AllReduceResponse>)>> waiters;
  };

  struct PendingSelection {
    int64_t step = -1;
    std::vector<bool> submitted;
    // [rank][tensor] -> scores (empty for tensors that are always important)
    std::vector<std::vector<std::vector<float>>> scores;
    std::vector<std::function<void(absl::StatusOr<v1::Selection>)>> waiters;
  };

  Job(const v1::JobSpec& spec, JobContext ctx);

  absl::Status CheckLive() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<int> TensorIndex(const std::string& name) const;
  absl::Status CheckRank(int32_t rank) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckRoundBuffer(int64_t round) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status HandleShard(int32_t rank, const v1::GradientShard& shard)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status HandleClose(int32_t rank, const v1::RoundClose& close)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs on the executor.
  void RunUpdate(int64_t round);
  // Completes a pending selection if it is complete and drained. Returns the
  // callbacks to run (outside the lock).
  std::vector<std::function<void()>> MaybeFinishSelectionLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::Selection SelectionLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FillColumnState(const TensorState& t, const std::vector<int32_t>& cols,
                       v1::ColumnState* out) const;

  const v1::JobSpec spec_;
  const JobContext ctx_;
  const int32_t world_;
  const int64_t interval_;  // S
  int64_t params_ = 0;

  mutable Mutex mu_;
  bool deleted_ ABSL_GUARDED_BY(mu_) = false;
  bool uploaded_ ABSL_GUARDED_BY(mu_) = false;
  // Tensor buffers: metadata immutable; contents guarded by mu_, except that
  // the update of a round owns master/m/v/count of its columns and the
  // round's accumulation buffer while it runs (no other writer can exist
  // then: see HandleShard/HandOff preconditions).
  std::vector<TensorState> tensors_;
  std::vector<RankState> ranks_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, RoundState> rounds_ ABSL_GUARDED_BY(mu_);
  int64_t rounds_closed_ ABSL_GUARDED_BY(mu_) = 0;   // fully closed rounds
  int64_t rounds_updated_ ABSL_GUARDED_BY(mu_) = 0;  // updates finished
  int64_t selection_version_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t selection_step_ ABSL_GUARDED_BY(mu_) = 0;
  // Per tensor: the selection version whose leaving state has been applied.
  std::vector<int64_t> handoff_applied_version_ ABSL_GUARDED_BY(mu_);
  PendingSelection pending_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, PendingReduce> reduces_ ABSL_GUARDED_BY(mu_);
  // When the last fully closed round closed (its last rank's close).
  std::chrono::steady_clock::time_point last_full_close_ ABSL_GUARDED_BY(mu_);

  // Statistics.
  int64_t shards_received_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t shard_bytes_received_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t rounds_skipped_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t delta_messages_sent_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t delta_bytes_sent_ ABSL_GUARDED_BY(mu_) = 0;
  double update_seconds_total_ ABSL_GUARDED_BY(mu_) = 0;
  double last_update_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  RejectionCounter rejected_;
};

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_JOB_H_
