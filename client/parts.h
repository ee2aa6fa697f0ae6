// A job spread over several daemons (docs/several-daemons.md): how the
// client library plans a job's partition map. The partitioned client
// (partitioned_client.h) creates jobs by it and fans a Client's calls out to
// one single-daemon client per daemon; tools and tests use the plan itself.
//
// Every tensor lives on one daemon, or, when it is larger than a daemon's
// share of the job, is split into column blocks on different daemons
// (JobSpec.partition).
#ifndef ZENFLOW_CLIENT_PARTS_H_
#define ZENFLOW_CLIENT_PARTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "zenflow/v1/zenflow.pb.h"

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

}  // namespace zenflow

#endif  // ZENFLOW_CLIENT_PARTS_H_
