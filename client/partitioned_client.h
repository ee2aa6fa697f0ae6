// The client of a job spread over several daemons (docs/several-daemons.md;
// the plan is in parts.h): a Client that holds one single-daemon client per
// daemon and fans every call out to them. Internal to //client:
// Client::Connect makes one when the target lists several daemons.
//
// Pushes, uploads and state calls go to the tensor's daemon (a split
// tensor's: cut by block, in block-local columns); round closes go to every
// daemon; a round is whole when every daemon's part of it arrived.
// Selection, hand-off and all-reduce are split by tensor and run on the
// daemons at once. Top-k is per tensor, and every block's daemon gets its
// tensor's whole importance and keeps its block's share of the tensor's
// top-k, so the ranks end as they would on one daemon, bit for bit.
#ifndef ZENFLOW_CLIENT_PARTITIONED_CLIENT_H_
#define ZENFLOW_CLIENT_PARTITIONED_CLIENT_H_

#include <cstdint>
#include <deque>
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
#include "absl/time/time.h"
#include "client/client.h"
#include "client/one_daemon_client.h"
#include "client/partition_map.h"
#include "common/mutex.h"

namespace zenflow {

class PartitionedClient final : public Client {
 public:
  // `clients`: one per daemon, connected to `targets` in the same order.
  PartitionedClient(Transport transport, std::vector<std::string> targets,
                    std::vector<std::unique_ptr<OneDaemonClient>> clients, int64_t split_params);

  Transport transport() const override { return transport_; }

  // ---- Control ----
  using Client::GetState;
  using Client::GetStats;
  using Client::HandOff;
  absl::StatusOr<v1::JobSpec> CreateJob(const v1::JobSpec& spec) override;
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
  // The round once every daemon's part is in. A wait that fails (its time
  // ran out) keeps the parts it took, and so does PollRound: the next wait
  // for the round starts from them.
  absl::StatusOr<RoundUpdate> WaitRound(int64_t round, absl::Duration timeout) override;
  std::optional<RoundUpdate> PollRound() override;
  void Recycle(std::string buffer) override;
  std::vector<absl::Status> TakeErrors() override;
  bool WaitForErrors(size_t n, absl::Duration timeout) override;

  absl::Status stream_status() override;
  ClientStats stats() override;
  const std::shared_ptr<grpc::Channel>& channel() const override { return clients_[0]->channel(); }
  int32_t rank() override { return clients_[0]->rank(); }
  std::string job_id() override { return clients_[0]->job_id(); }
  std::string token() override { return clients_[0]->token(); }
  int daemons() const override { return n(); }

 private:
  using Block = PartitionMap::Block;
  using Blocks = PartitionMap::Blocks;
  using Piece = PartitionMap::Piece;
  using Place = PartitionMap::Place;

  int n() const { return static_cast<int>(clients_.size()); }
  // `s` with daemon `part` named in front.
  absl::Status Named(int part, const absl::Status& s) const;
  // Runs `call(i)` for every i in `which` at once (a thread each). The
  // first to fail makes the others' rendezvous calls give up
  // (AbandonCalls): they would wait for ranks that cannot come. Returns
  // that first failure, named, or OK.
  absl::Status Each(const std::vector<int>& which, const std::function<absl::Status(int)>& call);
  std::vector<int> All() const;
  // `push(daemon's client, its columns, first, n)` for each daemon's run of
  // the columns (first and n index `columns`).
  absl::Status PushToParts(
      const std::string& tensor, const int32_t* columns, int64_t ncols,
      const std::function<absl::Status(OneDaemonClient*, const int32_t*, int64_t, int64_t)>& push);
  // A push of one shard message, cut by block for a split tensor.
  absl::Status PushShardMessage(v1::UpMessage msg);
  // ---- Rounds (partitioned_rounds.cc) ----
  // Adds daemon `part`'s update of a round; the whole round once every
  // daemon's is in.
  absl::StatusOr<std::optional<RoundUpdate>> Offer(int part, RoundUpdate u)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(rounds_mu_);
  // Every daemon's update of one round, in daemon order, as one round.
  absl::StatusOr<RoundUpdate> Combine(std::vector<RoundUpdate> parts);

  const Transport transport_;
  const int64_t split_params_;  // ClientOptions.split_tensor_params
  PartitionMap map_;

  Mutex mu_;
  std::vector<absl::Status> errors_ ABSL_GUARDED_BY(mu_);
  size_t recycle_next_ ABSL_GUARDED_BY(mu_) = 0;

  // Rounds that came in through PollRound or the callback, per daemon.
  Mutex rounds_mu_;
  std::map<int64_t, std::vector<std::optional<RoundUpdate>>> partial_ ABSL_GUARDED_BY(rounds_mu_);
  std::deque<RoundUpdate> whole_ ABSL_GUARDED_BY(rounds_mu_);
  bool delivering_ ABSL_GUARDED_BY(rounds_mu_) = false;
  std::function<void(RoundUpdate)> callback_ ABSL_GUARDED_BY(rounds_mu_);

  // One per daemon. Declared last, so destroyed first: their receive
  // threads run the round callbacks, which use the members above.
  const std::vector<std::unique_ptr<OneDaemonClient>> clients_;
};

}  // namespace zenflow

#endif  // ZENFLOW_CLIENT_PARTITIONED_CLIENT_H_
