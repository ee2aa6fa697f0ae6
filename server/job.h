// One optimizer job inside zenflowd: its tensors' fp32 master, Adam moments
// and accumulation buffers (column-major), the rounds of every rank, the
// column selection and the update that turns a closed round into parameter
// deltas (docs/design.md rules 5-9). No gRPC here: the service adapts it.
//
// Its spec is checked before it is made (job_spec.h); its counters are
// JobStatistics (job_stats.h). Its members are defined by concept:
// job.cc (making, membership and liveness, state), job_upload.cc,
// job_rounds.cc (shards, closes, the update), job_selection.cc (selection,
// hand-off, all-reduce) and job_checkpoint.cc.
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
#include <mutex>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/adamw.h"
#include "common/codec.h"
#include "common/histogram.h"
#include "common/mutex.h"
#include "common/thread_pool.h"
#include "common/up_wire.h"
#include "server/all_reduce_barrier.h"
#include "server/divergence.h"
#include "server/hand_off.h"
#include "server/delta_recycler.h"
#include "server/job_spec.h"
#include "server/job_stats.h"
#include "server/mailbox.h"
#include "server/round_accumulator.h"
#include "server/round_update.h"
#include "server/selection_barrier.h"
#include "server/tensor_store.h"
#include "server/update_scheduler.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

// Daemon-wide resources a job uses. Not owned.
struct JobContext {
  ThreadPool* pool = nullptr;          // AdamW and accumulation workers
  UpdateScheduler* scheduler = nullptr;  // runs round updates (a strand per job)
  SimdLevel simd = SimdLevel::kScalar;
  // Which set of stochastic-rounding draws 8-bit state's v takes (zenflowd
  // --adam8_draw_seed, a diagnostic; 0: the default).
  uint32_t adam8_draw_seed = 0;
  // Per rank: the outbox size above which its stream stops reading (<= 0:
  // unlimited).
  int64_t outbox_limit_bytes = 0;
  // Called (without the job's lock, on its update strand) after each round's
  // update with the job's id and its rounds updated so far; may be empty.
  std::function<void(const std::string& job_id, int64_t rounds_updated)> round_updated;
  // Every round update takes at least this long: after the real work the
  // update waits out the rest before its deltas reach the outboxes, standing
  // in for a model whose CPU update is that slow (zenflowd
  // --emulate_round_ms; docs/benchmarks.md#fidelity). 0: no wait.
  double emulate_round_seconds = 0;
  // The daemon keeps no checkpoints (no --state_dir): a restart loses the
  // job whatever the ranks kept, so every updated round counts as durable
  // and riding-through ranks keep no replay log (RoundDone.durable_rounds).
  bool nothing_survives_restart = false;
};

// A job's whole state at a round boundary, as named sections of owned bytes
// (what a checkpoint file holds; job_checkpoint.cc).
struct JobSnapshot {
  std::string job_id;
  int64_t rounds_updated = 0;  // the round boundary it was taken at
  std::vector<std::pair<std::string, std::string>> sections;
  double pause_seconds = 0;  // how long the job's lock was held for the copy
};

// Thread-safe. Every method validates completely before it changes anything,
// so a rejected request leaves the job exactly as it was.
class Job : public std::enable_shared_from_this<Job> {
 public:
  // `spec` must already be normalized. RESOURCE_EXHAUSTED (with the sizes)
  // when the memory cannot be allocated; nothing stays allocated then.
  static absl::StatusOr<std::shared_ptr<Job>> Create(const v1::JobSpec& spec, JobContext ctx);

  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  const v1::JobSpec& spec() const { return spec_; }
  int64_t params() const { return params_; }
  const JobFootprint& footprint() const { return footprint_; }
  // The SHA-256 digest of the job's token (server/auth.h); empty: admin
  // only. Set by the registry before the job is published, then constant.
  const std::string& credential() const { return credential_; }
  void set_credential(std::string digest) { credential_ = std::move(digest); }

  // One UploadParameters stream; commits atomically. Values are staged,
  // row-major, in the odd rounds' accumulation buffers (idle until the
  // parameters are in), so an upload allocates nothing. One upload runs at a
  // time. Not thread-safe (one per stream).
  class Upload {
   public:
    // ALREADY_EXISTS once the parameters are in; ABORTED while another
    // upload of the job runs.
    static absl::StatusOr<std::unique_ptr<Upload>> Begin(std::shared_ptr<Job> job);
    // An upload that did not commit clears what it staged.
    ~Upload();
    Upload(const Upload&) = delete;
    Upload& operator=(const Upload&) = delete;

    absl::Status AddChunk(const v1::UploadParametersRequest& chunk);
    // Fails (and commits nothing) unless every tensor is complete;
    // ALREADY_EXISTS after another upload committed.
    absl::StatusOr<v1::UploadParametersResponse> Commit();

   private:
    explicit Upload(std::shared_ptr<Job> job);
    std::shared_ptr<Job> job_;
    std::vector<int64_t> filled_;
    bool committed_ = false;
  };

  absl::StatusOr<v1::JoinJobResponse> Join(int32_t rank);
  void Describe(v1::GetJobResponse* out);
  void Stats(v1::JobStats* out);

  // The mailbox of a joined rank, for its data stream.
  absl::StatusOr<std::shared_ptr<Mailbox>> MailboxFor(int32_t rank);
  // A stream attached: the message that greets it.
  v1::DownMessage AttachedMessage(int32_t rank);
  // What a rank that attaches again with Attach.rounds_done = `rounds_done`
  // must be sent again after the greeting: nothing when it has every
  // updated round; the last updated round's deltas and RoundDone when the
  // job was restored from a checkpoint taken after that round and the rank
  // lacks just that one (a daemon killed between the checkpoint and the
  // deltas reaching the rank); FAILED_PRECONDITION when it lacks more, or
  // the round cannot be made again (arithmetic deltas, an older file).
  absl::StatusOr<std::vector<Mailbox::Message>> MissedRound(int32_t rank, int64_t rounds_done);

 private:
  // Per tensor: the daemon's (unimportant) columns now, ascending.
  std::vector<std::vector<int32_t>> RemoteColumnsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the deltas of a round of `steps` steps carry the columns' state
  // for the ranks' predicted step (ZenFlowConfig.predicted_step).
  bool WithMoments(int32_t steps) const;

 public:

  // A shard or a round-close marker from `rank` (already attached).
  // `payload`: a shard's payload where it arrived (the message's own field
  // is then empty, see common/up_wire.h); null: the message's field.
  absl::Status HandleUp(int32_t rank, const v1::UpMessage& up, Wire wire,
                        const ShardPayload* payload = nullptr);

  // Calls `done` (possibly on another thread, possibly before returning)
  // once every rank has submitted importance for the same step and every
  // closed round has been updated. `call` identifies the call for
  // WithdrawImportance. A second call of a rank for the step it is already
  // waiting on replaces the first (which gets ABORTED): a retry after a lost
  // answer is safe.
  void SubmitImportance(const v1::SubmitImportanceRequest& req, uint64_t call,
                        std::function<void(absl::StatusOr<v1::Selection>)> done);
  // The call was cancelled (deadline, client gone): its contribution is
  // withdrawn, its memory released and `done` is never called. No-op if the
  // rendezvous already completed or the call was replaced.
  void WithdrawImportance(int32_t rank, uint64_t call);

  absl::StatusOr<v1::HandOffResponse> HandOff(const v1::HandOffRequest& req);

  // Calls `done` once every rank has sent its parts for the same step. A
  // rank has at most one all-reduce pending; a retry for the same step
  // replaces it (the earlier call gets ABORTED).
  void AllReduce(const v1::AllReduceRequest& req, uint64_t call,
                 std::function<void(absl::StatusOr<v1::AllReduceResponse>)> done);
  // As WithdrawImportance, for an all-reduce.
  void WithdrawAllReduce(int32_t rank, uint64_t call);

  // The job was deleted: fails waiters and all later calls with NOT_FOUND.
  void Shutdown();

  void CountRejection(absl::StatusCode code) { rejected_.Add(code); }

  // A data stream of `rank` attached (returns its number) / ended (an end
  // of an older stream than the newest attached is ignored).
  uint64_t StreamAttached(int32_t rank);
  void StreamEnded(int32_t rank, uint64_t stream);
  // A joined rank without a data stream for longer than `timeout` cannot
  // take part in anything: the calls waiting on it (selection, all-reduce)
  // fail with ABORTED naming it, and the attached ranks' streams end with
  // that status (their rounds cannot complete). Once per absence; a rank
  // that attaches again starts afresh. Called periodically by the server.
  void FailIfRankGone(absl::Duration timeout);

  // ---- The job's end (docs/protocol.md, "When a job ends") ----
  struct Finished {
    int32_t ranks_finished = 0;  // this one included
    bool all = false;            // every rank of world_size has finished
    bool keep = false;           // and one of them asked to keep the job
  };
  // Rank `rank` is done with the job (DeleteJobRequest.finished_rank); a
  // rank counts once. INVALID_ARGUMENT for a rank outside world_size,
  // NOT_FOUND once the job is deleted.
  absl::StatusOr<Finished> FinishRank(int32_t rank, bool keep);
  // What the job is doing, for the error that tells a second run with the
  // same job id why it cannot have it.
  struct Presence {
    absl::Time held_since;  // created (or restored) on this daemon
    int32_t attached = 0;   // ranks with a data stream now
    int32_t finished = 0;
    int64_t rounds_updated = 0;
  };
  Presence GetPresence();
  // How long no rank has had a data stream (counted from the job's
  // creation, or from its last stream's end); zero while a rank has one or
  // the parameters are being uploaded. zenflowd --job_idle_ttl_s reads it.
  absl::Duration IdleFor();

  // Rounds [0, rounds) are in a durable checkpoint (the checkpointer says
  // so once the file is synced); RoundDone and Attached carry it to the
  // ranks, who may forget what they sent for those rounds.
  void SetDurableRounds(int64_t rounds);

  // ---- Checkpoints (job_checkpoint.cc) ----
  // Waits until no round update is in flight, then copies the job's state
  // (spec, column sets, rounds, hand-off ledger, master/m/v/counts, both
  // rounds' sums and arrivals) under its lock. Calls waiting on the
  // selection or an all-reduce are not part of it (they end with the
  // daemon). NOT_FOUND once deleted.
  absl::StatusOr<JobSnapshot> Snapshot();
  // Replaces a fresh job's state (made by Create from the snapshot's spec)
  // with the snapshot's; DATA_LOSS naming what does not fit.
  absl::Status LoadSnapshot(const std::map<std::string, const std::string*>& sections);

  // GetState and SetState (the RPCs; docs/python.md). GetState
  // waits up to 60 s for a round being updated; DEADLINE_EXCEEDED past it.
  absl::StatusOr<v1::GetStateResponse> GetState(const v1::GetStateRequest& req);
  // FAILED_PRECONDITION once the job's first selection or round has
  // happened; INVALID_ARGUMENT (naming what) for state that does not fit.
  absl::Status SetState(const v1::SetStateRequest& req);

  // For tests: exact fp32 state of one column (values, m, v, count).
  absl::StatusOr<v1::ColumnState> ReadColumns(const std::string& tensor,
                                              const std::vector<int32_t>& cols);

 private:
  // When the job was created or restored (JobStats.age_seconds).
  const absl::Time created_ = absl::Now();
  struct TensorState {
    std::string name;
    int64_t rows = 0;
    int64_t cols = 0;
    bool always_important = false;  // 1-D or local (in zenflow mode)
    DType param_dtype = DType::kF32;
    // A column block of a tensor split over daemons (Partition): this
    // tensor's columns are the whole tensor's [block_first, block_first +
    // cols) of its select_cols; its importance covers every column of the
    // whole tensor and top-k is the whole tensor's. Otherwise 0 and cols.
    int64_t block_first = 0;
    int64_t select_cols = 0;
    // (Master, m, v and counts: store_; round sums and arrivals: acc_.)
    std::vector<uint8_t> important;           // current selection
    std::vector<int32_t> important_cols;      // ascending
    std::vector<int32_t> prev_important_cols;  // before the last reselection
  };
  friend class Upload;

  struct RankState {
    bool joined = false;
    int64_t next_round = 0;  // first round this rank has not closed
    v1::WorkerStats worker;  // what its worker reported (sums)
    HistogramCounts stall_per_step{StallSecondsBuckets()};
    std::shared_ptr<Mailbox> mailbox;
    // The data stream (docs/checkpoints.md#dead-ranks): attached, or since when not.
    bool streaming = false;
    std::chrono::steady_clock::time_point stream_gone = std::chrono::steady_clock::now();
    bool absence_reported = false;
    uint64_t stream_number = 0;
    bool adding = false;  // a shard of this rank is being added (outside mu_)
    // It said it is done with the job (FinishRank), asking to keep it or not.
    bool finished = false;
    bool keep = false;
    // The first step of its open round (next_round * S with a fixed
    // interval) and the largest step it sent gradients of in that round.
    int64_t round_first_step = 0;
    int64_t round_last_step = -1;
  };

  struct RoundState {
    int32_t closed = 0;
    int64_t steps_sum = 0;
    int32_t steps = 0;  // the round's steps (as its closes said)
    float lr = 0.0f;
    bool nonfinite = false;
    // A shard not proven below 2^63 in magnitude was added (or the round
    // was restored from a snapshot, which does not say): its update checks
    // the round's gradient before AdamW (RoundUpdateInput::bounded).
    bool unbounded = false;
    std::chrono::steady_clock::time_point last_close;
    double interval_seconds = 0;  // previous round's last close -> this one's
    double max_stall_seconds = 0;  // the largest stall a rank's close reported
    bool first_shard_seen = false;
    std::chrono::steady_clock::time_point first_shard;
    // Rank-ordered sums: ranks [0, folded) are in rank 0's sum
    // (FoldClosedRanksLocked), a fold is running outside the lock, the
    // update is scheduled.
    int32_t folded = 0;
    bool folding = false;
    bool scheduled = false;
  };


  Job(const v1::JobSpec& spec, JobContext ctx, const JobFootprint& footprint);

  absl::Status CheckLive() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<int> TensorIndex(const std::string& name) const;
  // OUT_OF_RANGE unless 0 <= rank < world_ (needs no lock: world_ is
  // constant); CheckRank also wants the rank joined.
  absl::Status CheckRankInRange(int32_t rank) const;
  absl::Status CheckRank(int32_t rank) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells the compiler's lock analysis that mu_ is held, in the conditions
  // passed to mu_.Await: Await runs them with mu_ held (common/mutex.h),
  // but a lambda is a function of its own to clang, which cannot see that.
  void AwaitHoldsMu() const ABSL_ASSERT_EXCLUSIVE_LOCK(mu_) {}
  // A steady_clock interval in seconds, for the figures the job reports.
  static double Seconds(std::chrono::steady_clock::duration d) {
    return std::chrono::duration<double>(d).count();
  }
  absl::Status CheckRoundBuffer(int64_t round) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `replay`: what the job already has is dropped without an error.
  // Checks a shard under mu_, then releases mu_ while AddShard checks and
  // adds its values, and records it under mu_ again.
  absl::Status HandleShard(int32_t rank, const v1::GradientShard& shard,
                           const ShardPayload& payload, Wire wire, bool replay)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct AddPlan {
    int ti;
    int64_t round;
    bool int8;
    DType dt;
    size_t esize;
    int64_t step_in_round;  // the shard's step, 0-based in its round
    // Per column of the shard: the rank's first add of the round into it,
    // which stores (RoundAccumulator::first_add_stores); null: every add
    // adds (shared sums).
    const uint8_t* first = nullptr;
  };
  // Without mu_: INVALID_ARGUMENT for non-finite values (unless the job
  // skips such rounds: then *finite = false and nothing is added), else adds
  // the values to the round's sums.
  // *bounded: every value is below 2^63 in magnitude (see
  // RoundUpdateInput::bounded); false when that is not known.
  absl::Status AddShard(int32_t rank, const v1::GradientShard& shard,
                        const ShardPayload& payload, const AddPlan& plan, bool* finite,
                        bool* bounded);
  // The rejection of a shard whose value (column `col` of the shard, `row`)
  // is not finite.
  absl::Status NonFiniteShardError(const v1::GradientShard& shard, const ShardPayload& payload,
                                   const AddPlan& plan, size_t col, size_t row) const;
  // Waits until no shard is being added, and keeps new ones from starting
  // meanwhile. Whatever changes what shards are checked against (column
  // sets, hand-off versions, the upload, deletion) or reads or writes the
  // sums other than through a round's update lease calls it first.
  void QuiesceAddsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status HandleClose(int32_t rank, const v1::RoundClose& close, bool replay)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The figures a worker sends with a round's close (RoundClose.step_reports).
  absl::Status CheckWorkerReport(const v1::RoundClose& close, int64_t steps) const;
  void AddWorkerReport(const v1::RoundClose& close, RankState* rs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After rank's close of round r: the ranks' sums that can be folded now
  // (rank-ordered sums), then, once every rank closed the round and all are
  // folded, its update scheduled. May let go of mu_ while it folds.
  void FoldClosedRanksLocked(int32_t rank, int64_t r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs on the job's strand, holding the round's lease.
  void RunUpdate(UpdateLease lease);
  // After the update of a round that divergence_->Start took (its lr and
  // grad norm): the update divergence (job_divergence.cc).
  std::optional<float> MeasureDivergence(float lr, float grad_norm, TensorStore* store);
  // A round of `steps` steps measured `divergence`: the job's figures, and
  // the warning of a fixed interval beyond the budget.
  void NoteDivergenceLocked(float divergence, int32_t steps) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static constexpr size_t kDivergenceWindow = 5;
  // Completes a pending selection if it is complete and drained. Returns the
  // callbacks to run (outside the lock).
  std::vector<std::function<void()>> MaybeFinishSelectionLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::Selection SelectionLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FillColumnState(int ti, const std::vector<int32_t>& cols,
                       v1::ColumnState* out) const;

  const v1::JobSpec spec_;
  const JobContext ctx_;
  const int32_t world_;
  const int64_t interval_;  // S (S_max with auto_interval_)
  const bool auto_interval_;  // rounds of 1..S steps (ZenFlowConfig.auto_update_interval)
  // The pending selection: guarded by mu_ (declared here for its
  // initialization from the spec).
  SelectionBarrier selection_ ABSL_GUARDED_BY(mu_);
  const JobFootprint footprint_;
  std::string credential_;  // see credential()
  const absl::Time held_since_ = absl::Now();
  // This job's round updates, in order; other jobs' updates run beside them.
  const std::shared_ptr<UpdateScheduler::Strand> strand_;
  // The delta messages' buffers, given back by the outboxes for the next
  // update (bounded by footprint_.delta_bytes); shared with the messages'
  // deleters, which may outlive the job.
  const std::shared_ptr<DeltaRecycler> recycler_;
  int64_t params_ = 0;

  mutable Mutex mu_;
  bool deleted_ ABSL_GUARDED_BY(mu_) = false;
  bool uploaded_ ABSL_GUARDED_BY(mu_) = false;
  bool uploading_ ABSL_GUARDED_BY(mu_) = false;  // an Upload is staging
  // Tensor buffers: metadata immutable; contents guarded by mu_, except what
  // an UpdateLease (round_update.h) grants its round's update.
  std::vector<TensorState> tensors_;
  // fp32 master, m, v and update counts; access as for tensors_' contents.
  std::unique_ptr<TensorStore> store_;
  // Round sums and which rank sent which column for which step; access as
  // for tensors_' contents (a round's update owns that round's sums).
  std::unique_ptr<RoundAccumulator> acc_;
  // What the update needs of each tensor (immutable).
  std::vector<RoundUpdateTensor> update_tensors_;
  // The update divergence's sample (docs/design.md rule 14): drawn under
  // mu_, captured as shards are added, measured by the round's update.
  std::unique_ptr<UpdateDivergence> divergence_;
  // Measured divergences of the last rounds (newest last, at most 5) and
  // whether a fixed interval's excess over the budget was logged.
  std::vector<float> recent_divergence_ ABSL_GUARDED_BY(mu_);
  bool budget_warned_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<RankState> ranks_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, RoundState> rounds_ ABSL_GUARDED_BY(mu_);
  int64_t rounds_closed_ ABSL_GUARDED_BY(mu_) = 0;   // fully closed rounds
  int64_t rounds_updated_ ABSL_GUARDED_BY(mu_) = 0;  // updates finished
  int64_t selection_version_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t selection_step_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t durable_rounds_ ABSL_GUARDED_BY(mu_) = 0;
  // The RoundDone of the newest updated round (checkpointed with the job).
  std::optional<v1::RoundDone> last_done_ ABSL_GUARDED_BY(mu_);
  // Restored from a checkpoint: the newest updated round's deltas and
  // RoundDone made again from the restored master, for ranks that never
  // got them (MissedRound); kept until round resend_round_ + 2 is updated,
  // by when every rank has applied it (apply delay <= S).
  int64_t restored_rounds_ ABSL_GUARDED_BY(mu_) = 0;  // rounds updated at the restore
  int64_t resend_round_ ABSL_GUARDED_BY(mu_) = -1;
  std::vector<Mailbox::Message> resend_ ABSL_GUARDED_BY(mu_);
  // Who handed off which selection's state; guarded by mu_.
  HandOffLedger hand_off_ ABSL_GUARDED_BY(mu_);
  // The all-reduce rendezvous: its own lock (it needs no job state).
  AllReduceBarrier all_reduce_;
  // When the last fully closed round closed (its last rank's close).
  std::chrono::steady_clock::time_point last_full_close_ ABSL_GUARDED_BY(mu_);

  // Shards being added outside mu_, and callers of QuiesceAddsLocked waiting.
  int64_t adds_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t quiesce_waiters_ ABSL_GUARDED_BY(mu_) = 0;
  // Shared sums (not rank-ordered): the stripe locks of column blocks of at
  // least kStripeElements values (tensor and block hashed onto a stripe).
  static constexpr int64_t kStripeElements = 16384;
  std::array<std::mutex, 64> stripes_;
  // What GetStats reports of the job beyond its state (job_stats.h).
  JobStatistics stats_ ABSL_GUARDED_BY(mu_);
  RejectionCounter rejected_;
};

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_JOB_H_
