// What a partitioned client knows of its job's partition map (parts.h):
// where each tensor lives, learned from the daemons' specs of the job, and
// how a push's columns or a tensor's state are cut by daemon. Internal to
// //client: the partitioned client (partitioned_client.h) holds one.
#ifndef ZENFLOW_CLIENT_PARTITION_MAP_H_
#define ZENFLOW_CLIENT_PARTITION_MAP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

// Appends a block's state (block-local columns) to a tensor's, whose
// columns are the block's plus `first`.
void AppendState(const v1::ColumnState& block, int64_t first, v1::ColumnState* to);

// The important columns of every tensor of `map`, from each daemon's
// answer (a split tensor's blocks joined into one ColumnSet).
std::vector<v1::ColumnSet> MergeSelections(const v1::Partition& map,
                                           const std::vector<const v1::Selection*>& got);

// Thread-safe. Until Learn (or Merge) ran, lookups fail with
// FAILED_PRECONDITION.
class PartitionMap {
 public:
  // `targets`: the job's daemons, in the order the client lists them.
  explicit PartitionMap(std::vector<std::string> targets) : targets_(std::move(targets)) {}
  PartitionMap(const PartitionMap&) = delete;
  PartitionMap& operator=(const PartitionMap&) = delete;

  int n() const { return static_cast<int>(targets_.size()); }
  const std::string& target(int part) const { return targets_[part]; }

  // Daemon `part`'s spec of the job is a part of a job over these daemons,
  // the part they are listed as.
  absl::Status CheckPart(int part, const v1::JobSpec& spec) const;
  // Learns (or checks) the map from every daemon's spec of the job.
  absl::Status Learn(const std::vector<v1::JobSpec>& specs) ABSL_LOCKS_EXCLUDED(mu_);
  // Learns the map, then gives the job's whole spec from its parts' specs
  // (tensors in map order).
  absl::StatusOr<v1::JobSpec> Merge(const std::vector<v1::JobSpec>& specs)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The map learned last (part 0).
  v1::Partition map() ABSL_LOCKS_EXCLUDED(mu_);

  // One column block of a split tensor: columns [first, first + cols) on `part`.
  struct Block {
    int part = 0;
    int64_t first = 0;
    int64_t cols = 0;
  };
  using Blocks = std::shared_ptr<const std::vector<Block>>;
  // Where a tensor lives: its daemon (a split tensor's first block's), and
  // for a split tensor its blocks (null otherwise). One lookup.
  struct Place {
    int part = 0;
    Blocks blocks;
  };
  absl::StatusOr<Place> Locate(const std::string& tensor) ABSL_LOCKS_EXCLUDED(mu_);
  // The daemon that hosts `tensor` (for a split tensor, its first block's;
  // FAILED_PRECONDITION before the map is known).
  absl::StatusOr<int> PartOf(const std::string& tensor) ABSL_LOCKS_EXCLUDED(mu_);
  // A split tensor's blocks; null for one that is not split (or unknown).
  Blocks SplitOf(const std::string& tensor) ABSL_LOCKS_EXCLUDED(mu_);
  // The block on `part` of a split tensor, or null (not split, or not there).
  static const Block* BlockOn(const Blocks& blocks, int part);

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
  // `state` (any columns of a tensor) cut by daemon, in block-local columns.
  absl::StatusOr<std::vector<std::pair<int, v1::ColumnState>>> SplitState(
      const v1::ColumnState& state) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const std::vector<std::string> targets_;

  Mutex mu_;
  bool known_ ABSL_GUARDED_BY(mu_) = false;
  v1::Partition map_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> part_of_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Blocks> blocks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zenflow

#endif  // ZENFLOW_CLIENT_PARTITION_MAP_H_
