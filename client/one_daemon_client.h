// The client of one zenflowd: a Client whose target names a single daemon.
// Internal to //client (Client::Connect makes one; the partitioned client
// holds one per daemon).
//
// It owns the gRPC channel and stub for the control calls, the rank's data
// stream (an AttachedStream over a gRPC or UCX DataStream), the send window
// the stream drains, the round assembler the stream fills, and the replay log
// that rides the rank through a restart of its daemon (ride_through.cc).
#ifndef ZENFLOW_CLIENT_ONE_DAEMON_CLIENT_H_
#define ZENFLOW_CLIENT_ONE_DAEMON_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/replay_log.h"
#include "client/round_assembler.h"
#include "client/send_window.h"
#include "common/mutex.h"
#include "grpcpp/grpcpp.h"
#include "zenflow/v1/zenflow.grpc.pb.h"

namespace zenflow {

class AttachedStream;
class UcxLink;

class OneDaemonClient final : public Client {
 public:
  // Connects to `target`, the one daemon options.target names (as
  // SplitTargets gives it; options.target is what messages quote).
  static absl::StatusOr<std::unique_ptr<OneDaemonClient>> Connect(const ClientOptions& options,
                                                                  const std::string& target);
  ~OneDaemonClient() override;

  Transport transport() const override { return options_.transport; }

  // ---- Control ----
  using Client::GetState;
  using Client::GetStats;
  using Client::HandOff;
  absl::StatusOr<v1::JobSpec> CreateJob(const v1::JobSpec& spec) override;
  // CreateJob; `new_token` gets the token the daemon made for the job
  // (empty when the call carried the caller's own).
  absl::StatusOr<v1::JobSpec> CreateJobTokened(const v1::JobSpec& spec, std::string* new_token);
  // The token to send from now on (a partitioned job's, made by its first
  // daemon).
  void SetToken(const std::string& token);
  absl::StatusOr<v1::UploadParametersResponse> UploadParameters(
      const std::string& job_id, const std::vector<TensorValues>& tensors) override;
  absl::StatusOr<v1::JoinJobResponse> JoinJob(const std::string& job_id, int32_t rank) override;
  absl::Status Attach(const std::string& job_id, int32_t rank) override;
  absl::StatusOr<v1::GetJobResponse> GetJob(const std::string& job_id) override;
  absl::StatusOr<v1::GetJobResponse> WaitForUpload(const std::string& job_id,
                                                   absl::Duration timeout) override;
  absl::Status DeleteJob(const std::string& job_id) override;
  absl::StatusOr<v1::DeleteJobResponse> FinishJob(const std::string& job_id, int32_t rank,
                                                  bool keep) override;
  absl::StatusOr<v1::ColumnState> GetState(const std::string& job_id, const std::string& tensor,
                                           int64_t* selection_version) override;
  absl::Status SetState(const std::string& job_id, const v1::ColumnState& state) override;
  absl::StatusOr<v1::GetStatsResponse> GetStats(const std::string& job_id) override;
  absl::StatusOr<v1::Selection> SubmitImportance(
      int64_t step, const std::vector<v1::TensorImportance>& tensors) override;
  absl::StatusOr<v1::HandOffResponse> HandOff(int64_t version,
                                              const std::vector<v1::ColumnState>& leaving,
                                              const std::vector<std::string>& tensors) override;
  absl::StatusOr<std::vector<std::vector<float>>> AllReduce(
      int64_t step,
      const std::vector<std::pair<std::string, const std::vector<float>*>>& parts) override;
  // Cancels the rendezvous calls in flight (a partitioned job's other daemon
  // failed the same operation: these would wait for ranks that cannot come).
  void AbandonCalls();
  // The stream's break acted on now, without waiting for a round: ridden
  // through (reconnect, re-attach, replay) where the client rides through,
  // else returned. OK while the stream is open. A partitioned job calls it
  // for a daemon whose part of the awaited round is already in.
  absl::Status RecoverBrokenStream();

  // ---- Data ----
  using Client::CloseRound;
  absl::Status PushUp(v1::UpMessage msg) override;
  absl::Status PushColumns(int64_t step, const std::string& tensor, int64_t version,
                           const std::vector<int32_t>& columns, const float* col_major,
                           int64_t rows, DType dtype) override;
  absl::Status PushEncodedBorrowed(int64_t step, const std::string& tensor, int64_t version,
                                   const int32_t* columns, int64_t ncols, const char* payload,
                                   int64_t rows, DType dtype,
                                   std::function<void()> release) override;
  absl::Status PushInt8Borrowed(int64_t step, const std::string& tensor, int64_t version,
                                const int32_t* columns, int64_t ncols, const int8_t* payload,
                                const float* scales, int64_t rows,
                                std::function<void()> release) override;
  absl::Status CloseRound(int64_t round, float lr, int32_t steps,
                          const WorkerReport& report) override;
  absl::Status Flush(absl::Duration timeout) override;

  void SetRoundCallback(std::function<void(RoundUpdate)> cb) override;
  absl::StatusOr<RoundUpdate> WaitRound(int64_t round, absl::Duration timeout) override;
  std::optional<RoundUpdate> PollRound() override;
  void Recycle(std::string buffer) override;
  std::vector<absl::Status> TakeErrors() override;
  bool WaitForErrors(size_t n, absl::Duration timeout) override;

  absl::Status stream_status() override;
  ClientStats stats() override;
  const std::shared_ptr<grpc::Channel>& channel() const override { return channel_; }
  int32_t rank() override;
  std::string job_id() override;
  std::string token() override;
  int daemons() const override { return 1; }

 private:
  explicit OneDaemonClient(const ClientOptions& options);
  std::shared_ptr<AttachedStream> current_stream();
  // Closes the attached stream, if any (sends what is queued first).
  void CloseStream();
  // Pushes `ncols` encoded columns (col_bytes each) as shards of at most
  // max_shard_bytes, borrowing `payload` until `release` (the last shard
  // lets go of it).
  absl::Status PushBorrowed(int64_t step, const std::string& tensor, int64_t version,
                            const int32_t* columns, int64_t ncols, const char* payload,
                            int64_t col_bytes, v1::DType dtype, const float* scales,
                            std::function<void()> release);
  std::unique_ptr<grpc::ClientContext> UnaryContext(absl::Duration timeout);
  // A rendezvous call (SubmitImportance, HandOff, AllReduce) that
  // AbandonCalls can end early (ABORTED, not ridden through).
  absl::Status Rendezvous(absl::Duration timeout,
                          const std::function<grpc::Status(grpc::ClientContext*)>& call);
  absl::Status RawSubmitImportance(const v1::SubmitImportanceRequest& req,
                                   v1::SubmitImportanceResponse* resp);
  absl::Status RawHandOff(const v1::HandOffRequest& req, v1::HandOffResponse* resp);
  absl::Status RawAllReduce(const v1::AllReduceRequest& req, v1::AllReduceResponse* resp);
  absl::Status Enqueue(v1::UpMessage msg, absl::string_view borrowed = {},
                       std::shared_ptr<void> hold = nullptr);

  // ---- Riding through a daemon restart (ride_through.cc) ----
  bool ride_through() const { return options_.daemon_wait > absl::ZeroDuration(); }
  // A failure the daemon's going away explains.
  static bool Recoverable(const absl::Status& s);
  // Reconnects, re-attaches and replays the log, unless another thread did
  // since generation `seen`. Past daemon_wait: UNAVAILABLE saying so.
  absl::Status Recover(uint64_t seen);
  absl::Status ReattachAndReplay(const std::string& job_id, int32_t rank);
  // After a re-attach: waits until `round` is updated (every rank's close
  // of it reached the daemon), as the greeting or a RoundDone says.
  // UNAVAILABLE when the stream ends first.
  absl::Status WaitRoundUpdated(int64_t round);
  // Runs `call` (a unary call's status), recovering and retrying when the
  // daemon went away.
  absl::Status RideThrough(const std::function<absl::Status()>& call);
  int64_t RoundOfStep(int64_t step) const;

  const ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::ZenFlow::Stub> stub_;
  SendWindow window_;
  RoundAssembler rounds_;
  ReplayLog log_;
  std::atomic<int64_t> interval_{0};  // the job's update_interval, for the log's rounds
  // auto_update_interval: rounds of changing length, so the log's round of
  // a step is the rank's open round, the one after its last close.
  std::atomic<bool> auto_interval_{false};
  std::atomic<int64_t> open_round_{0};
  std::atomic<int64_t> selection_round_{0};  // of the last selection, for hand-offs
  // One recovery at a time; generation_ counts those that succeeded.
  Mutex recover_mu_;
  std::atomic<uint64_t> generation_{0};

  // Rendezvous calls in flight, each with its abandoned flag.
  Mutex calls_mu_;
  std::map<grpc::ClientContext*, bool*> calls_ ABSL_GUARDED_BY(calls_mu_);

  // Serializes attaching and closing streams.
  Mutex attach_mu_;
  std::unique_ptr<UcxLink> ucx_ ABSL_GUARDED_BY(attach_mu_);  // by the first UCX attach
  // ucx_, for Recycle and stats: published once it exists (it then lives as
  // long as the client), read without a lock.
  std::atomic<UcxLink*> ucx_ready_{nullptr};

  Mutex mu_;
  std::string job_id_ ABSL_GUARDED_BY(mu_);
  std::string token_ ABSL_GUARDED_BY(mu_);
  int32_t rank_ ABSL_GUARDED_BY(mu_) = -1;
  std::shared_ptr<AttachedStream> stream_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zenflow

#endif  // ZENFLOW_CLIENT_ONE_DAEMON_CLIENT_H_
