// A job spread over several daemons (README "Several daemons"): the part of
// the client library that plans a job's partition map and fans a Client's
// calls out to one single-daemon Client per daemon. Internal to
// client/client.cc: a Client whose target lists several daemons holds one.
//
// Every tensor lives on one daemon, or, when it is larger than a daemon's
// share of the job, is split into column blocks on different daemons
// (JobSpec.partition). Pushes, uploads and state calls go to the tensor's
// daemon (a split tensor's: cut by block, in block-local columns); round
// closes go to every daemon; a round is whole when every daemon's part of it
// arrived. Selection, hand-off and all-reduce are split by tensor and run on
// the daemons at once. Top-k is per tensor, and every block's daemon gets its
// tensor's whole importance and keeps its block's share of the tensor's
// top-k, so the ranks end as they would on one daemon, bit for bit.
#ifndef ZENFLOW_CLIENT_PARTS_H_
#define ZENFLOW_CLIENT_PARTS_H_

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "client/client.h"

namespace zenflow {

inline constexpr int kMaxDaemons = 64;  // daemons one job may spread over (as zenflowd)

// The targets in a ClientOptions.target: one or more "host:port",
// comma-separated. INVALID_ARGUMENT for an empty entry or a repeated one.
absl::StatusOr<std::vector<std::string>> SplitTargets(const std::string& target);

// The partition map of `spec` over `parts` daemons (version 1, `part` 0):
// tensors in job order, balancing the parameters the daemons host (2-D
// tensors that are not local; every tensor in zero_offload mode). A hosted
// 2-D tensor (not local) with more parameters than `split_params` is split
// into ceil(params / split_params) column blocks; with split_params 0, one
// of more than twice a daemon's share (share = ceil(hosted / parts)) into
// ceil(params / share). Blocks: at most `parts` and the tensor's columns,
// near-equal, the first ones a column wider. Then whole
// tensors and blocks go greedily, largest first, onto the daemon with the
// fewest hosted parameters that holds no other block of the same tensor; a
// daemon with fewer entries wins a tie, then the lower index.
// INVALID_ARGUMENT when there are fewer entries than daemons.
absl::StatusOr<v1::Partition> PlanPartition(const v1::JobSpec& spec, int parts,
                                            int64_t split_params = 0);
// The spec daemon `part` gets: its tensors, and the map with its index.
v1::JobSpec PartSpec(const v1::JobSpec& spec, const v1::Partition& map, int part);

class Client::Parts {
 public:
  Parts(std::vector<std::string> targets, std::vector<std::unique_ptr<Client>> clients,
        int64_t split_params);

  absl::StatusOr<v1::JobSpec> CreateJob(const v1::JobSpec& spec);
  absl::StatusOr<v1::UploadParametersResponse> UploadParameters(
      const std::string& job_id, const std::vector<TensorValues>& tensors);
  absl::StatusOr<v1::JoinJobResponse> JoinJob(const std::string& job_id, int32_t rank);
  absl::Status Attach(const std::string& job_id, int32_t rank);
  absl::StatusOr<v1::GetJobResponse> GetJob(const std::string& job_id);
  absl::StatusOr<v1::GetJobResponse> WaitForUpload(const std::string& job_id,
                                                   absl::Duration timeout);
  absl::Status DeleteJob(const std::string& job_id);
  absl::StatusOr<v1::ColumnState> GetState(const std::string& job_id, const std::string& tensor,
                                           int64_t* selection_version);
  absl::Status SetState(const std::string& job_id, const v1::ColumnState& state);
  absl::StatusOr<v1::GetStatsResponse> GetStats(const std::string& job_id);
  absl::StatusOr<v1::Selection> SubmitImportance(int64_t step,
                                                 const std::vector<v1::TensorImportance>& tensors);
  absl::StatusOr<v1::HandOffResponse> HandOff(int64_t version,
                                              const std::vector<v1::ColumnState>& leaving,
                                              const std::vector<std::string>& tensors);
  absl::StatusOr<std::vector<std::vector<float>>> AllReduce(
      int64_t step, const std::vector<std::pair<std::string, const std::vector<float>*>>& parts);
  absl::Status PushUp(v1::UpMessage msg);
  // The daemon that hosts `tensor` (for a split tensor, its first block's;
  // FAILED_PRECONDITION before the map is known); its Client; a status with
  // that daemon named in front.
  absl::StatusOr<int> PartOf(const std::string& tensor) ABSL_LOCKS_EXCLUDED(mu_);
  // One column block of a split tensor: columns [first, first + cols) on `part`.
  struct Block {
    int part = 0;
    int64_t first = 0;
    int64_t cols = 0;
  };
  // A run of a push's columns that goes to one daemon: the input's columns
  // [begin, end). For a split tensor `local` holds them block-local; for a
  // tensor that is not split it is empty (the daemon's columns are the
  // input's): cols() gives the daemon's columns either way.
  struct Piece {
    int part = 0;
    int64_t begin = 0, end = 0;
    std::vector<int32_t> local;
    const int32_t* cols(const int32_t* input) const {
      return local.empty() ? input + begin : local.data();
    }
  };
  // `n` columns of `tensor` cut into pieces by daemon, in order (one piece
  // for a tensor that is not split). INVALID_ARGUMENT for a column outside
  // a split tensor.
  absl::StatusOr<std::vector<Piece>> Pieces(const std::string& tensor, const int32_t* columns,
                                            int64_t n) ABSL_LOCKS_EXCLUDED(mu_);
  Client* client(int part) { return clients_[part].get(); }
  absl::Status Named(int part, const absl::Status& s) const;
  absl::Status CloseRound(int64_t round, float lr, int32_t steps, const WorkerReport* report);
  absl::Status Flush(absl::Duration timeout);
  void SetRoundCallback(std::function<void(RoundUpdate)> cb);
  absl::StatusOr<RoundUpdate> WaitRound(int64_t round, absl::Duration timeout);
  std::optional<RoundUpdate> PollRound();
  void Recycle(std::string buffer);
  std::vector<absl::Status> TakeErrors();
  bool WaitForErrors(size_t n, absl::Duration timeout);
  absl::Status stream_status();
  ClientStats stats();
  Client* first() { return clients_[0].get(); }
  int daemons() const { return n(); }

 private:
  int n() const { return static_cast<int>(clients_.size()); }
  // Daemon `part`'s spec of the job is a part of a job over these daemons,
  // the part they are listed as.
  absl::Status CheckPart(int part, const v1::JobSpec& spec) const;
  // Learns (or checks) the map from every daemon's spec of the job.
  absl::Status Learn(const std::vector<v1::JobSpec>& specs) ABSL_LOCKS_EXCLUDED(mu_);
  // The job's whole spec from its parts' specs (tensors in map order).
  absl::StatusOr<v1::JobSpec> Merge(const std::vector<v1::JobSpec>& specs);
  // Runs `call(i)` for every i in `which` at once (a thread each). The
  // first to fail makes the others' rendezvous calls give up
  // (AbandonCalls): they would wait for ranks that cannot come. Returns
  // that first failure, named, or OK.
  absl::Status Each(const std::vector<int>& which, const std::function<absl::Status(int)>& call);
  std::vector<int> All() const;
  // Adds daemon `part`'s update of a round; the whole round once every
  // daemon's is in.
  absl::StatusOr<std::optional<RoundUpdate>> Offer(int part, RoundUpdate u)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(rounds_mu_);
  absl::StatusOr<RoundUpdate> Combine(std::vector<RoundUpdate> parts);
  using Blocks = std::shared_ptr<const std::vector<Block>>;
  // Where a tensor lives: its daemon (a split tensor's first block's), and
  // for a split tensor its blocks (null otherwise). One lookup.
  struct Place {
    int part = 0;
    Blocks blocks;
  };
  absl::StatusOr<Place> Locate(const std::string& tensor) ABSL_LOCKS_EXCLUDED(mu_);
  // A split tensor's blocks; null for one that is not split (or unknown).
  Blocks SplitOf(const std::string& tensor) ABSL_LOCKS_EXCLUDED(mu_);
  // The block on `part` of a split tensor, or null (not split, or not there).
  static const Block* BlockOn(const Blocks& blocks, int part);
  // `state` (any columns of a tensor) cut by daemon, in block-local columns.
  absl::StatusOr<std::vector<std::pair<int, v1::ColumnState>>> SplitState(
      const v1::ColumnState& state) ABSL_LOCKS_EXCLUDED(mu_);
  // A push of one shard message, cut by block for a split tensor.
  absl::Status PushShardMessage(v1::UpMessage msg);

  const std::vector<std::string> targets_;
  const std::vector<std::unique_ptr<Client>> clients_;
  const int64_t split_params_;  // ClientOptions.split_tensor_params

  Mutex mu_;
  bool known_ ABSL_GUARDED_BY(mu_) = false;
  v1::Partition map_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> part_of_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Blocks> blocks_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> errors_ ABSL_GUARDED_BY(mu_);
  size_t recycle_next_ ABSL_GUARDED_BY(mu_) = 0;

  // Rounds that came in through PollRound or the callback, per daemon.
  Mutex rounds_mu_;
  std::map<int64_t, std::vector<std::optional<RoundUpdate>>> partial_ ABSL_GUARDED_BY(rounds_mu_);
  std::deque<RoundUpdate> whole_ ABSL_GUARDED_BY(rounds_mu_);
  bool delivering_ ABSL_GUARDED_BY(rounds_mu_) = false;
  std::function<void(RoundUpdate)> callback_ ABSL_GUARDED_BY(rounds_mu_);
};

}  // namespace zenflow

#endif  // ZENFLOW_CLIENT_PARTS_H_
